"""Horovod's own TensorFlow tests, run against tfcomp: every default compression becomes tfcomp's.

Horovod's test files are not part of this repository (their licence and our policy): give them at
run time, either as an extracted `test/` folder of Horovod v0.28.1 or as a Horovod git directory
(then `git archive <--horovod_ref> test` extracts it). To get them:

  git clone --bare https://github.com/horovod/horovod.git /tmp/horovod.git   # or any mirror
  git --git-dir=/tmp/horovod.git archive v0.28.1 test | tar -x -C /tmp/horovod-tests

The tests need the pip packages `parameterized` and `mock` besides pytest.

The harness copies that `test/` folder into a temporary directory and runs each file as

  horovodrun -np 2 -H localhost:2 --gloo python -m pytest -v -p benchmarks.horovod_compat_shim parallel/FILE

from there, one run at a time, cut off after --timeout seconds. The shim (see its docstring) makes
tfcomp's compressor the default compression of Horovod's DistributedOptimizer and
DistributedGradientTape (tensorflow, tensorflow.keras and keras, and their Partial variants) and logs
each test's outcome per rank and the strategies its tfcomp exchanges used. Compressions: `none`
(nothing patched: stock Horovod, the baseline), `NoCompression`, `FP16`, `TopK`
(tfcomp.TopK(ratio=1.0, strategy="allgather", min_elements=1)), `TopK-artopk` (the same with
strategy="artopk"): the sparsifiers keep every element, so Horovod's exact expectations hold, and are
forced onto the compressed path (by default tensors under 8192 elements, all of Horovod's test
models, go dense). Horovod's test_tensorflow.py and test_tensorflow_process_sets.py run every test
twice, first in TF1 graph mode, which tfcomp refuses by design, then eagerly: the shim leaves the
graph-mode half's calls to Horovod (column `Graph mode`: tests that had such calls) so that the
eager half runs with tfcomp. This checkout comes first on the workers' PYTHONPATH, so its tfcomp is
the one tested; each run gets a fresh calibration cache in its temporary directory.

Run from the repository root:

  python -m benchmarks.horovod_compat --horovod_tests=/tmp/horovod-tests/test
      [--horovod_ref=v0.28.1] [--compression=none,NoCompression,FP16,TopK,TopK-artopk] [--files=test_tensorflow.py,...]
      [--timeout=1800] [--keep_logs=DIR] [--json_out=benchmarks/results/horovod_compat.json]
      [--markdown_out=benchmarks/results/horovod_compat.md]

Results of earlier runs in --json_out are kept unless this run repeats their file and compression,
so the matrix can be filled in several runs; the Markdown is written from all of them.
"""

import collections
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.cluster import horovodrun_executable
from benchmarks.tables import markdown_table, text_table

__all__ = ["COMPRESSIONS", "FILES", "group_failures", "run_file", "strategies_per_test"]

COMPRESSIONS = ["none", "NoCompression", "FP16", "TopK", "TopK-artopk"]
FILES = ["test_tensorflow2_keras.py", "test_tensorflow2_keras_process_sets.py", "test_tensorflow_process_sets.py",
         "test_tensorflow.py"]
OUTCOMES = ["passed", "failed", "skipped", "error"]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_string("horovod_tests", None, "Horovod's test/ folder, a checkout holding it, or a Horovod git directory.")
flags.DEFINE_string("horovod_ref", "v0.28.1", "The tag or commit to extract when --horovod_tests is a git directory.")
flags.DEFINE_list("compression", COMPRESSIONS, f"Default compressions to run, of {COMPRESSIONS}.")
flags.DEFINE_list("files", FILES, "Test files in test/parallel.")
flags.DEFINE_integer("timeout", 1800, "Seconds one horovodrun of one file may take.")
flags.DEFINE_string("keep_logs", None, "Keep each run's horovodrun output and per-rank logs here.")
flags.DEFINE_string("json_out", os.path.join(REPO_ROOT, "benchmarks", "results", "horovod_compat.json"),
                    "Results of all runs (merged with this file's earlier ones).")
flags.DEFINE_string("markdown_out", os.path.join(REPO_ROOT, "benchmarks", "results", "horovod_compat.md"),
                    "The tables and failures in Markdown.")
flags.mark_flag_as_required("horovod_tests")


def _git(*args, git_dir=None) -> str:
    command = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def copy_tests(source: str, ref: str, dest: str) -> str:
    """Puts Horovod's test/ folder at dest/test; returns where it came from, for the record."""
    for folder in (source, os.path.join(source, "test")):
        if os.path.isdir(os.path.join(folder, "parallel")):
            shutil.copytree(folder, os.path.join(dest, "test"))
            return os.path.abspath(folder)
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}", git_dir=source)
    archive = subprocess.Popen(["git", f"--git-dir={source}", "archive", commit, "test"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} test failed in {source}")
    return f"{os.path.abspath(source)} at {ref} ({commit})"


def _read_log(path: str) -> dict:
    """A rank's log (see benchmarks/horovod_compat_shim.py) as {"collected", "tfcomp", "tests"}."""
    log = {"collected": None, "tfcomp": None, "tests": []}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if "collected" in record:
                    log.update(record)
                else:
                    log["tests"].append(record)
    return log


def _run(command: list, cwd: str, env: dict, out_path: str, timeout: int) -> tuple:
    """(return code or None when cut off, seconds); the output goes to out_path."""
    start = time.monotonic()
    with open(out_path, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=timeout), time.monotonic() - start
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)  # horovodrun ends its workers
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return None, time.monotonic() - start


def run_file(test_dir: str, file: str, compression: str, timeout: int, log_dir: str) -> dict:
    """Runs test/parallel/<file> on two workers; the result record of this file and compression."""
    out = os.path.join(log_dir, f"{os.path.splitext(file)[0]}.{compression}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, TFCOMP_COMPAT_COMPRESSION=compression, TFCOMP_COMPAT_OUT=out,
               TFCOMP_CALIBRATION_CACHE=os.path.join(out, "calibration.json"), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    command = [horovodrun_executable(), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m", "pytest", "-v",
               "-p", "benchmarks.horovod_compat_shim", os.path.join("parallel", file)]
    returncode, seconds = _run(command, test_dir, env, os.path.join(out, "horovodrun.log"), timeout)
    logs = [_read_log(os.path.join(out, f"rank{rank}.jsonl")) for rank in range(2)]
    ranks = []
    for log in logs:
        counts = collections.Counter(t["outcome"] for t in log["tests"])
        ranks.append({o: counts[o] for o in OUTCOMES})
        ran = sum(1 for t in log["tests"] if "::" in t["test"])
        ranks[-1]["not_run"] = None if log["collected"] is None else log["collected"] - ran
    failures = {}
    for rank, log in enumerate(logs):
        for test in log["tests"]:
            if test["outcome"] in ("failed", "error"):
                entry = failures.setdefault(test["test"], {"test": test["test"], "outcome": test["outcome"],
                                                           "message": test["message"], "ranks": []})
                entry["ranks"].append(rank)

    def tests_with(key):
        return len({t["test"] for log in logs for t in log["tests"] if t.get(key)})

    strategies = collections.Counter(s for t in logs[0]["tests"] for s in t.get("strategies", {}))
    return {"file": file, "compression": compression, "seconds": round(seconds), "timed_out": returncode is None,
            "returncode": returncode, "tfcomp": logs[0]["tfcomp"], "collected": [log["collected"] for log in logs],
            "ranks": ranks, "tests_replaced": tests_with("replaced"), "tests_explicit": tests_with("explicit"),
            "tests_graph_mode": tests_with("graph_mode"), "strategies": dict(strategies),
            "test_strategies": {t["test"].split("::", 1)[-1]: t["strategies"] for t in logs[0]["tests"]
                                if t.get("strategies")},
            "failures": sorted(failures.values(), key=lambda f: f["test"])}


def group_failures(results: list) -> dict:
    """{file: {message: {test: [compression, with "(rank r)" when only rank r failed]}}}, hex addresses in
    the messages made alike."""
    groups = {}
    for result in results:
        for failure in result["failures"]:
            message = re.sub(r"0x[0-9a-f]+", "0x…", failure["message"])
            test = failure["test"].split("::", 1)[-1]
            by_test = groups.setdefault(result["file"], {}).setdefault(message, {})
            only = f" (rank {failure['ranks'][0]})" if len(failure["ranks"]) == 1 else ""
            by_test.setdefault(test, []).append(result["compression"] + only)
    return groups


def strategies_per_test(results: list) -> dict:
    """{file: {test: {compression: "strategy xN, ..."}}} over the results that recorded them."""
    table = {}
    for result in results:
        for test, counts in result.get("test_strategies", {}).items():
            text = ", ".join(f"{s} x{n}" for s, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
            table.setdefault(result["file"], {}).setdefault(test, {})[result["compression"]] = text
    return table


def _per_rank(result: dict, key: str) -> str:
    values = [rank[key] for rank in result["ranks"]]
    return "/".join("-" if v is None else str(v) for v in values)


def _strategies(result: dict) -> str:
    """"strategy: tests" over the tests of rank 0, most used first; "-" for stock Horovod."""
    if result["compression"] == "none":
        return "-"
    counts = sorted(result.get("strategies", {}).items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{strategy}: {tests}" for strategy, tests in counts) or "none recorded"


def _columns() -> list:
    def note(r):
        if r["timed_out"]:
            return "timed out"
        return "" if r["returncode"] == 0 else f"rc {r['returncode']}"

    def tfcomp_column(key):
        return lambda r: "-" if r["compression"] == "none" or key not in r else str(r[key])

    return ([("File", 40, lambda r: r["file"]), ("Compression", 13, lambda r: r["compression"]),
             ("Seconds", 7, lambda r: str(r["seconds"]))]
            + [(key.replace("_", " ").capitalize(), 9, lambda r, key=key: _per_rank(r, key))
               for key in OUTCOMES + ["not_run"]]
            + [("tfcomp tests", 12, tfcomp_column("tests_replaced")), ("Graph mode", 10, tfcomp_column("tests_graph_mode")),
               ("Strategies (tests)", 30, _strategies), ("Note", 9, note)])


def markdown(results: list, header: str) -> str:
    lines = [header, "", markdown_table(_columns(), results, first_left=True), "",
             "Counts are rank 0 / rank 1. `Not run`: collected but without an outcome (cut off by the timeout, or "
             "the worker died). `tfcomp tests`: tests in which a DistributedOptimizer or tape got tfcomp's "
             "compressor. `Graph mode`: tests whose TF1 graph-mode half (refused by tfcomp by design) was left to "
             "Horovod's own compression, their eager half running with tfcomp's. `Strategies (tests)`: how the "
             "tests' tfcomp exchanges sent their gradients (from `tfcomp.exchange_of(...).records`; a test "
             "counts once per strategy it used): `TopK allgather` / `TopK artopk` compressed buckets, `allreduce` "
             "dense (dtypes tfcomp does not compress, such as float64 and integers, and NoCompression), "
             "`fp16 allreduce`, `sparse allgather` (IndexedSlices). Tests that passed their own compression: "
             f"{sum(r['tests_explicit'] for r in results)}.", "", "## Strategies per test", "",
             "How each test's tfcomp exchanges sent the gradients (rank 0; gradients per strategy).", ""]
    for file, by_test in strategies_per_test(results).items():
        lines += [f"### {file}", ""]
        lines += [f"- {test}: " + "; ".join(f"{compression}: {counts}" for compression, counts in by_compression.items())
                  for test, by_compression in sorted(by_test.items())]
        lines.append("")
    lines += ["## Failures and errors, by first error line", ""]
    for file, by_message in group_failures(results).items():
        lines += [f"### {file}", ""]
        for message, by_test in sorted(by_message.items(), key=lambda item: -len(item[1])):
            lines.append(f"- `{message}` ({len(by_test)} test{'s' if len(by_test) > 1 else ''})")
            lines += [f"  - {test}: {', '.join(compressions)}" for test, compressions in sorted(by_test.items())]
        lines.append("")
    return "\n".join(lines)


def _load(path: str) -> dict:
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {f"{r['compression']}/{r['file']}": r for r in json.load(f)["results"]}


def main(argv):
    del argv
    unknown = set(FLAGS.compression) - set(COMPRESSIONS)
    if unknown:
        raise app.UsageError(f"unknown compressions {sorted(unknown)}; choose from {COMPRESSIONS}")
    commit = _git("-C", REPO_ROOT, "describe", "--always", "--dirty")
    results = _load(FLAGS.json_out)
    with tempfile.TemporaryDirectory() as tmp:
        source = copy_tests(FLAGS.horovod_tests, FLAGS.horovod_ref, tmp)
        log_dir = FLAGS.keep_logs or os.path.join(tmp, "logs")
        for compression in FLAGS.compression:
            for file in FLAGS.files:
                print(f"{file} with {compression} ...", flush=True)
                result = run_file(os.path.join(tmp, "test"), file, compression, FLAGS.timeout, log_dir)
                result.update(commit=commit, date=datetime.datetime.now().isoformat(timespec="minutes"),
                              horovod_tests=source)
                results[f"{compression}/{file}"] = result
                print(text_table(_columns(), [result], first_left=True), flush=True)
    ordered = sorted(results.values(), key=lambda r: (FILES.index(r["file"]) if r["file"] in FILES else len(FILES),
                                                      r["file"], COMPRESSIONS.index(r["compression"])))
    print(text_table(_columns(), ordered, first_left=True))
    header = (f"# Horovod's TensorFlow tests with tfcomp as the default compression\n\n"
              f"2 workers (`horovodrun -np 2 -H localhost:2 --gloo`), {os.cpu_count()} vCPUs; tests from "
              f"{'; '.join(sorted({r['horovod_tests'] for r in ordered}))}; tfcomp commit {', '.join(sorted({r['commit'] for r in ordered}))}; runs of "
              f"{', '.join(sorted({r['date'][:10] for r in ordered}))}. Command: `python -m benchmarks.horovod_compat "
              f"--horovod_tests=DIR --compression=... --timeout={FLAGS.timeout}`")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"results": ordered}, f, indent=1)
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(markdown(ordered, header) + "\n")


if __name__ == "__main__":
    app.run(main)
