"""Quantiser benchmark: IntQuant's encode and decode against QSGD's and FP16's, side by side.

    python -m benchmarks.quantizer_benchmark [--elements=3299178] [--workers=4] [--repeats=25]
        [--warmup=3] [--markdown_out=PATH]

One process, one TensorFlow thread, a float32 gradient of --elements (default: the Fashion-MNIST
CNN's 3.3 M parameters), K = --workers. For each quantiser it times, as one tf.function returning a
scalar (so no result is copied out):

  encode   IntQuant(8): its scale, then `ops.int_quantize` (levels packed 4 per int32);
           QSGD(4): norm, noise, levels (TensorFlow ops); FP16: the cast to float16
  decode   IntQuant: `ops.int_dequantize` of the summed lanes, averaged; QSGD: the K payloads'
           levels times their norms, summed; FP16: the cast back to float32, averaged
  bytes    what one worker puts on the wire per step, and its fraction of float32's

interleaved round by round in an order shuffled every round (medians over --repeats after
--warmup). A single `add` pass (g + 1) is timed beside them as the yardstick.
"""

import numpy as np
import tensorflow as tf
from absl import app, flags

from benchmarks.tables import machine_header, print_table
from benchmarks.timing import shuffled_medians

__all__ = []

FLAGS = flags.FLAGS
flags.DEFINE_integer("elements", 3_299_178, "float32 gradient elements.")
flags.DEFINE_integer("workers", 4, "K: the decode sums K workers' payloads.")
flags.DEFINE_integer("repeats", 25, "Measured rounds.")
flags.DEFINE_integer("warmup", 3, "Discarded rounds.")
flags.DEFINE_string("markdown_out", None, "Also write the table as Markdown here.")

_COLUMNS = [
    ("quantiser", 12, lambda r: r["name"]),
    ("encode ms", 9, lambda r: f"{r['encode']:.2f}"),
    ("decode ms", 9, lambda r: f"{r['decode']:.2f}"),
    ("encode/add", 10, lambda r: f"{r['encode'] / r['add']:.1f}"),
    ("decode/add", 10, lambda r: f"{r['decode'] / r['add']:.1f}"),
    ("bytes", 10, lambda r: str(r["bytes"])),
    ("of float32", 10, lambda r: f"{r['bytes'] / (4 * FLAGS.elements):.3f}"),
]


def _functions(flat, workers: int) -> dict:
    """{quantiser: (encode function, decode function, wire bytes)}; each function returns a scalar."""
    import tfcomp

    seed = tf.constant(7, tf.int64)
    size = int(flat.shape[0])
    intquant, qsgd = tfcomp.IntQuant(8), tfcomp.QSGD(4)
    scale = tf.reduce_max(tf.abs(flat))
    lanes = intquant.encode_scaled(flat, scale, seed, 0, workers)
    qsgd_wire = tuple(tf.concat([t] * workers, 0) for t in qsgd.encode(flat, seed, 0).wire)
    half = tf.cast(flat, tf.float16)

    def function(body):
        return tf.function(body, autograph=False)

    return {
        "IntQuant(8)": (
            function(lambda: intquant.encode_scaled(flat, tf.reduce_max(tf.abs(flat)), seed, 0, workers).wire[0][0]),
            function(lambda: intquant.decode_sum(lanes.wire, lanes.context, size, workers, 1.0 / workers)[0]),
            intquant.payload_bytes(size)),
        "QSGD(4)": (
            function(lambda: qsgd.encode(flat, seed, 0).wire[0][0]),
            function(lambda: qsgd.decode_sum(qsgd_wire, None, size, workers, 1.0 / workers)[0]),
            qsgd.payload_bytes(size)),
        "FP16": (
            function(lambda: tf.cast(flat, tf.float16)[0]),
            function(lambda: (tf.cast(half, tf.float32) * (1.0 / workers))[0]),
            2 * size),
    }


def main(argv):
    del argv
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    flat = tf.constant(np.random.default_rng(0).standard_normal(FLAGS.elements, dtype=np.float32))
    quantisers = _functions(flat, FLAGS.workers)
    runs = {"add": tf.function(lambda: (flat + 1.0)[0], autograph=False)}
    for name, (encode, decode, _) in quantisers.items():
        runs[(name, "encode")], runs[(name, "decode")] = encode, decode
    medians = shuffled_medians(runs, FLAGS.repeats, FLAGS.warmup)
    add = medians["add"]
    rows = [{"name": name, "encode": medians[(name, "encode")], "decode": medians[(name, "decode")], "add": add,
             "bytes": wire}
            for name, (_, _, wire) in quantisers.items()]
    header = (f"{machine_header()}; one inter-op thread; {FLAGS.elements} float32 elements, K = {FLAGS.workers}; "
              f"median ms of {FLAGS.repeats} interleaved rounds; add pass {add:.2f} ms")
    print_table(header, _COLUMNS, rows, FLAGS.markdown_out)


if __name__ == "__main__":
    app.run(main)
