"""Seeded fuzz of every op: 2,000 cases each (TFCOMP_FUZZ_CASES), valid and invalid arguments, run by
tests/fuzz_worker.py in child processes, a batch of cases each, so that an abort, a segfault or an
AddressSanitizer report (scripts/asan_test.sh) fails the test with the seed and the case instead of
killing pytest. Valid calls must match the NumPy reference; invalid ones must raise a clean error that
names an invalid argument."""

import json
import os
import subprocess
import sys

import pytest

from tests.fuzz_worker import OPS, describe, draw_case
from tests.helpers import child_env

CASES_PER_OP = int(os.environ.get("TFCOMP_FUZZ_CASES", "2000"))
BATCHES_PER_OP = 2  # child processes per op (each imports TensorFlow, about 3 s)
BATCH_TIMEOUT_S = 900  # far above a batch's time, also under AddressSanitizer


def run_batch(op: str, seed: int, first: int, count: int) -> tuple:
    """Runs cases [first, first + count) in one child; returns ({case: (outcome, detail)}, the case
    that was running when the child died or None, the child's exit status and stderr)."""
    command = [sys.executable, "-m", "tests.fuzz_worker", "--op", op, "--seed", str(seed),
               "--first", str(first), "--count", str(count)]
    child = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    outcomes, started = {}, None
    for line in child.stdout.splitlines():
        if line.startswith("start "):
            started = int(line.split()[1])
        elif line.startswith("{"):
            record = json.loads(line)
            outcomes[record["case"]] = (record["outcome"], record["detail"])
    died = child.returncode != 0 or "AddressSanitizer" in child.stderr
    crashed = started if died and started is not None and started not in outcomes else None
    return outcomes, crashed, child.returncode if died else 0, child.stderr


@pytest.mark.jobs
@pytest.mark.parametrize("op", OPS)
def test_fuzz(op, rng):
    seed = int(rng.integers(2**31))
    batch = -(-CASES_PER_OP // BATCHES_PER_OP)
    outcomes, problems, first = {}, [], 0
    while first < CASES_PER_OP:
        count = min(batch, CASES_PER_OP - first)
        done, crashed, status, stderr = run_batch(op, seed, first, count)
        outcomes.update(done)
        rerun = f"python -m tests.fuzz_worker --op {op} --seed {seed} --first {{}} --count 1 --show"
        if crashed is not None:
            problems.append(f"case {crashed} crashed the worker (exit status {status}): "
                            f"{describe(*draw_case(seed, op, crashed))}\n  rerun: {rerun.format(crashed)}\n"
                            f"  stderr: {stderr[-3000:]}")
            first = crashed + 1
            continue
        if status != 0:
            problems.append(f"the worker for cases {first} to {first + count - 1} failed (exit status {status}): {stderr[-3000:]}")
        first += count
    counts = {kind: sum(outcome == kind for outcome, _ in outcomes.values()) for kind in ("valid", "rejected", "fail")}
    print(f"fuzz {op}: seed {seed}, {len(outcomes)} cases run: {counts}")
    for case, (outcome, detail) in sorted(outcomes.items()):
        if outcome == "fail" and len(problems) < 20:
            problems.append(f"case {case}: {detail}\n  {describe(*draw_case(seed, op, case))}\n  rerun: {rerun.format(case)}")
    assert not problems, f"fuzz of {op} with seed {seed}:\n" + "\n".join(problems)
    assert len(outcomes) == CASES_PER_OP
    # The generator must keep drawing both kinds of case.
    assert counts["valid"] > 0.4 * CASES_PER_OP and counts["rejected"] > 0.1 * CASES_PER_OP, counts


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
