"""Construction-time errors of tfcomp.DistributedOptimizer and the stock Horovod entry point."""

import sys

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import pytest
import tensorflow as tf

import tfcomp
from tfcomp import version


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
        assert opt._allreduce_grads.compressor == tfcomp.NoCompression()


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
    assert isinstance(opt._allreduce_grads, tfcomp.GradientExchange)
    assert opt._allreduce_grads.compressor == tfcomp.DRAGONN(0.01)


def test_horovod_compression_objects_are_accepted():
    opt = tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=hvd.Compression.fp16)
    assert opt._allreduce_grads.compressor == tfcomp.FP16()


def test_unsupported_tensorflow_or_keras_is_refused(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.16.1")
    with pytest.raises(RuntimeError, match=r"tfcomp supports TensorFlow >=2.15,<2.16 with Keras 2; .* 2.16.1"):
        version.check_supported_stack()
    monkeypatch.setattr(tf, "__version__", "2.15.1")
    monkeypatch.setattr(tf.keras, "__version__", "3.3.3", raising=False)
    with pytest.raises(RuntimeError, match=r"tfcomp supports .* tf.keras is Keras 3.3.3"):
        tfcomp.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=tfcomp.DRAGONN())


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
