"""Runs one op call in a child process with a limited address space, so that a kernel that ends the
process (an uncaught std::bad_alloc) fails a test instead of killing pytest, and one that asks for
far more memory than its inputs need fails cleanly instead of swapping the machine.

The child imports tfcomp.ops, runs `setup` (Python statements that build inputs, before the limit),
runs a small op (TensorFlow's thread pools and allocator start), limits its address space to what it
then uses plus `budget_mib`, and evaluates `call`, a Python expression over np, tf, ops, raw (the
generated op module) and the names setup defined. It prints one JSON line: {"outcome": "returned"}
(the outputs saved to --save as arrays output_0, output_1, ...; a bool or number the call returns,
a check it made itself, as "value") or {"outcome": "raised", "error": the exception's class name,
"message": its message}.

    python -m tests.op_child --budget-mib 512 \\
        "raw.tfcomp_hash_partition(np.ones(3, np.float32), np.array([0, 5, 9], np.int32), num_parts=2**26)"
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.helpers import child_env
from tfcomp import ops

__all__ = ["main", "run_in_child"]

CHILD_TIMEOUT_S = 300  # far above a call's time: TensorFlow's import and one small op


def run_in_child(call: str, budget_mib: int, setup: str = "", save: str | None = None) -> dict:
    """Runs `call` in a child (see the module doc); returns its JSON record, or {"outcome": "died",
    "returncode", "stderr"} when the child ends without one (a signal, an abort)."""
    command = [sys.executable, "-m", "tests.op_child", "--budget-mib", str(budget_mib), "--setup", setup, call]
    if save is not None:
        command += ["--save", save]
    # One malloc arena: the address space glibc reserves stays that of one thread, whichever runs the op.
    child = subprocess.run(command, env=child_env(MALLOC_ARENA_MAX="1"), capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S)
    records = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not records:
        return {"outcome": "died", "returncode": child.returncode, "stderr": child.stderr[-3000:]}
    return json.loads(records[-1])


def _address_space_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main(argv=None) -> int:
    """Runs one call under the limit and prints its outcome (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("call", help="a Python expression: the op call")
    parser.add_argument("--budget-mib", type=int, required=True, help="address space allowed beyond the start")
    parser.add_argument("--setup", default="", help="Python statements run before the limit")
    parser.add_argument("--save", help="an .npz file for the outputs of a call that returns")
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(2)
    names = {"np": np, "tf": tf, "ops": ops, "raw": ops.load_library()}
    exec(args.setup, names)  # noqa: S102 - the test's own statements
    ops.sparse_batched_decode(np.ones(3, np.float32), np.arange(3, dtype=np.int32), 4)  # start the runtime
    limit = _address_space_bytes() + args.budget_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = eval(args.call, names)  # noqa: S307 - the test's own expression
    except Exception as error:  # noqa: BLE001 - every error is reported to the parent
        print(json.dumps({"outcome": "raised", "error": type(error).__name__, "message": str(error)}), flush=True)
        return 0
    if isinstance(result, (bool, int, float)):  # a check the call computed itself
        print(json.dumps({"outcome": "returned", "value": result}), flush=True)
        return 0
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    if args.save:
        np.savez(args.save, **{f"output_{i}": np.asarray(output) for i, output in enumerate(outputs)})
    print(json.dumps({"outcome": "returned"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
