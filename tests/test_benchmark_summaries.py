"""The summary of benchmarks/gpu/compare.py, which interleaves GPU harness builds, from stand-in
harnesses that print drawn times."""

import numpy as np
import pytest


@pytest.mark.jobs
def test_gpu_compare_interleaves_the_builds_and_reports_their_medians(tmp_path, rng):
    """benchmarks/gpu/compare.py over two stand-in harness builds that print drawn times: the builds
    run in turn, round after round, and the medians and DGC / DRAGONN ratios are those of the rounds."""
    import subprocess
    import sys
    from pathlib import Path

    rounds = 5
    times = {name: np.round(rng.uniform(0.1, 0.4, size=(rounds, 2)), 6) for name in ("old", "new")}
    calls = tmp_path / "calls.txt"
    harnesses = []
    for name, table in times.items():
        script = tmp_path / f"{name}_harness"
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"with open({str(calls)!r}, 'a') as f: f.write({name!r} + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n"
            f"table = {table.tolist()!r}\n"
            f"done = sum(line.startswith({name!r} + ' ') for line in open({str(calls)!r})) - 1\n"
            "print('GPU\\tstand-in')\n"
            "print('RESULT\\tdragonn_compress\\t134217728\\t%.6f' % table[done][0])\n"
            "print('RESULT\\tdgc_compress\\t134217728\\t%.6f' % table[done][1])\n")
        script.chmod(0o755)
        harnesses += ["--harness", f"{name}={script}"]
    import benchmarks  # where this file's other imports come from, under pytest and Bazel alike

    compare = Path(benchmarks.__file__).parent / "gpu" / "compare.py"
    out = subprocess.run([sys.executable, str(compare), *harnesses, "--rounds", str(rounds), "--runs", "3",
                          "--ops", "dragonn_compress,dgc_compress"], check=True, capture_output=True, text=True).stdout
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["old", "new"] * rounds
    assert lines[0].split()[1:] == ["--bench", "--min-log2", "27", "--max-log2", "27", "--runs", "3"]
    summary = {line.split(":")[0]: line for line in out.splitlines() if line.startswith(("old:", "new:"))}
    for name, table in times.items():
        ratios = table[:, 1] / table[:, 0]
        assert summary[name] == (
            f"{name}: dragonn_compress {np.median(table[:, 0]):.4f}, dgc_compress {np.median(table[:, 1]):.4f}, "
            f"dgc/dragonn median {np.median(ratios):.3f} ({ratios.min():.3f} to {ratios.max():.3f})")
    assert out.count("ROUND\t") == 2 * rounds * 2  # each op once per build and round
