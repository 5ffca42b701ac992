"""Construction-time errors of tfcomp.DistributedOptimizer and the stock Horovod entry point."""

import sys

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import pytest
import tensorflow as tf

import tfcomp
from tests.helpers import run_python
from tfcomp import horovod_glue, version


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


def test_not_a_keras_optimizer_is_a_type_error():
    with pytest.raises(TypeError, match=r"optimizer must be a Keras optimizer .* got .*GradientDescentOptimizer"):
        tfcomp.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), compression=tfcomp.DRAGONN())
    with pytest.raises(TypeError, match=r"optimizer must be a Keras optimizer .* got builtins.str"):
        tfcomp.DistributedOptimizer("sgd", compression=tfcomp.DRAGONN())


def test_adasum_with_a_sparse_compressor_is_refused():
    with pytest.raises(ValueError, match=r"op=hvd.Adasum cannot combine the payloads of tfcomp.DRAGONN\("):
        tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=tfcomp.DRAGONN(), op=hvd_tf.Adasum)


def test_unknown_compression_is_a_type_error():
    with pytest.raises(TypeError, match=r"compression must be a tfcomp compressor .* got 'dragonn'"):
        tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression="dragonn")


@pytest.mark.parametrize("compression, message", [
    (tfcomp.DRAGONN, r"got the class tfcomp.DRAGONN: add \(\) to make one, compression=tfcomp.DRAGONN\(\)"),
    (tfcomp.FP16, r"got the class tfcomp.FP16: add \(\) to make one, compression=tfcomp.FP16\(\)"),
    ("TopK", r"got 'TopK' \(a string\): write compression=tfcomp.TopK\(\)"),
    (hvd.Compression, r"got hvd.Compression itself .*: write hvd.Compression.none or hvd.Compression.fp16"),
])
def test_a_compressor_class_or_name_is_a_type_error_saying_what_to_write(compression, message):
    with pytest.raises(TypeError, match=message):
        tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression)


def test_horovod_none_compression_still_maps_to_no_compression():
    for none in (hvd.Compression.none, hvd.Compression.none()):
        opt = tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=none)
        assert tfcomp.exchange_of(opt).compressor == tfcomp.NoCompression()


@pytest.mark.parametrize("make, message", [
    (lambda: tfcomp.DRAGONN(ratio=0), r"ratio must be a number in \(0, 1\], got 0"),
    (lambda: tfcomp.DGC(ratio=2.0), r"ratio must be a number in \(0, 1\], got 2.0"),
    (lambda: tfcomp.TopK(ratio="0.1"), r"ratio must be a number in \(0, 1\], got '0.1'"),
    (lambda: tfcomp.QSGD(bits=9), r"bits must be an integer in \[1, 7\], got 9"),
    (lambda: tfcomp.DRAGONN(warmup_steps=-1), r"warmup_steps must be an integer >= 0, got -1"),
])
def test_bad_hyper_parameters_are_value_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("entry", ["tfcomp", "horovod"])
def test_both_entry_points_build_the_same_kind_of_optimizer(entry):
    inner = tf.keras.optimizers.Adam(1e-3)
    wrap = tfcomp.DistributedOptimizer if entry == "tfcomp" else hvd.DistributedOptimizer
    opt = wrap(inner, compression=tfcomp.DRAGONN(0.01))
    assert type(opt).__name__ == "Adam" and isinstance(opt, tf.keras.optimizers.Adam)
    assert tfcomp.exchange_of(opt).compressor == tfcomp.DRAGONN(0.01)
    # Horovod's class is left as Horovod made it (a .keras file names it by its module, horovod._keras).
    assert type(opt).__module__ == "horovod._keras" and type(opt).__bases__ == (tf.keras.optimizers.Adam,)


def test_horovod_compression_objects_are_accepted():
    opt = tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=hvd.Compression.fp16)
    assert tfcomp.exchange_of(opt).compressor == tfcomp.FP16()


def test_unsupported_tensorflow_or_keras_is_refused(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.16.1")
    with pytest.raises(RuntimeError, match=r"tfcomp supports TensorFlow >=2.15,<2.16 with Keras 2; .* 2.16.1"):
        version.check_supported_stack()
    monkeypatch.setattr(tf, "__version__", "2.15.1")
    monkeypatch.setattr(tf.keras, "__version__", "3.3.3", raising=False)
    with pytest.raises(RuntimeError, match=r"tfcomp supports .* tf.keras is Keras 3.3.3"):
        tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=tfcomp.DRAGONN())


@pytest.mark.parametrize("installed", ["0.28.0", "0.28.1", "0.28.9"])
def test_supported_horovod_versions_pass_the_check(installed):
    horovod_glue.check_supported_horovod(installed)


@pytest.mark.parametrize("installed", ["0.27.2", "0.29.0", "1.0.0"])
def test_unsupported_horovod_versions_are_refused_saying_what_to_install(installed):
    with pytest.raises(RuntimeError, match=rf"tfcomp supports Horovod >=0.28,<0.29 .*; Horovod {installed} is installed\. "
                                           r"Install Horovod 0.28.1 built with Gloo and TensorFlow.*"
                                           r"HOROVOD_WITH_GLOO=1.*pip install --no-build-isolation horovod==0.28.1"):
        horovod_glue.check_supported_horovod(installed)


@pytest.mark.parametrize("installed, found", [("'0.27.2'", "Horovod 0.27.2 is installed"),
                                              ("None", "no Horovod is installed")])
@pytest.mark.jobs
def test_importing_the_glue_checks_the_installed_horovod_first(installed, found):
    """In a fresh process whose package metadata reports another Horovod (or none), the first use of a
    tfcomp name that needs Horovod stops at the check, before Horovod's TensorFlow package is imported."""
    code = ("import importlib.metadata as metadata, sys\n"
            "real = metadata.version\n"
            "def version(name):\n"
            f"    if name != 'horovod': return real(name)\n"
            f"    if {installed} is None: raise metadata.PackageNotFoundError(name)\n"
            f"    return {installed}\n"
            "metadata.version = version\n"
            "import tfcomp\n"
            "try:\n"
            "    tfcomp.DRAGONN\n"
            "except RuntimeError as error:\n"
            "    print(error)\n"
            "print('horovod.tensorflow' in sys.modules)\n")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    message, imported = result.stdout.strip().splitlines()
    assert message.startswith(f"tfcomp supports Horovod >=0.28,<0.29 (built and tested with 0.28.1); {found}.")
    assert "pip install --no-build-isolation horovod==0.28.1" in message
    assert imported == "False"


def test_horovods_factory_arguments_are_bound_by_name_however_they_are_passed():
    compressor = tfcomp.TopK(0.1)
    arguments = dict(name="by_keyword", device_dense="", device_sparse="", compression=compressor,
                     sparse_as_dense=False, op=hvd_tf.Sum, gradient_predivide_factor=2.0, groups=None,
                     process_set=hvd_tf.global_process_set)
    by_keyword = hvd_tf._make_allreduce_grads_fn(**dict(reversed(list(arguments.items()))))
    by_position = hvd_tf._make_allreduce_grads_fn(*arguments.values())
    for exchange in (by_keyword, by_position):
        assert isinstance(exchange, tfcomp.GradientExchange)
        assert exchange.compressor is compressor and exchange.op == hvd_tf.Sum
        assert exchange.gradient_predivide_factor == 2.0
    # Horovod's own compressors still reach Horovod's function, whatever the form of the call.
    horovod_fn = hvd_tf._make_allreduce_grads_fn(**{**arguments, "compression": hvd_tf.Compression.none})
    assert not isinstance(horovod_fn, tfcomp.GradientExchange) and callable(horovod_fn)


def test_a_horovod_hook_without_a_parameter_the_glue_reads_is_refused(monkeypatch):
    module, function, reads = horovod_glue.HOROVOD_HOOKS["reduction"]
    monkeypatch.setitem(horovod_glue.HOROVOD_HOOKS, "reduction", (module, function, (*reads, "bucket_bytes")))
    with pytest.raises(RuntimeError, match=r"tfcomp cannot wrap horovod.tensorflow._make_allreduce_grads_fn\(name, .*"
                                           r"\) of Horovod 0.28.1: it has no parameter bucket_bytes. "
                                           r"Install a supported Horovod: .*horovod==0.28.1"):
        horovod_glue.install()


def test_tf1_graph_mode_is_refused_at_construction():
    with tf.Graph().as_default():
        with pytest.raises(RuntimeError, match="TensorFlow 2 modes only"):
            hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1), compression=tfcomp.TopK(0.1))


def test_strategy_scope_is_refused_at_construction():
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match="runs under Horovod"):
            tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=tfcomp.DRAGONN())


@pytest.mark.parametrize("compression", [tfcomp.DRAGONN, "dragonn", 3])
@pytest.mark.parametrize("entry", ["horovod", "tfcomp"])
def test_wrong_compression_is_a_type_error_at_construction(entry, compression):
    wrap = hvd.DistributedOptimizer if entry == "horovod" else tfcomp.DistributedOptimizer
    with pytest.raises(TypeError, match="compression"):
        wrap(tf.keras.optimizers.SGD(0.1), compression=compression)


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_gradient_predivide_factor_is_refused_at_construction(factor):
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=tfcomp.TopK(0.1),
                                 gradient_predivide_factor=factor)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
