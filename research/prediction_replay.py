"""The predictions of a network validation grid, priced again by the cost model as the code has it now.

    python -m research.prediction_replay GRID.json [GRID.json ...] [--markdown_out=F]

`benchmarks/network_validation.py --json_out` keeps, beside each measured step, the plan its
prediction priced (`tfcomp.planning.Plan.record`: buckets, ready times, calibrated figures, fitted
overlap slowdown) and, for plain Horovod, the gradients' sizes and ready times; since 2026-11-27
22:30 UTC also the exchange's end measured in the warm-up (what the slowdown was fitted to). This
prices them again, fitting the overlap slowdown again where that measurement is kept: T = T_comp -
the backward pass after the first gradient + the exchange's end, with T_comp from the measured
compute steps as the worker computes it now (`network_worker.compute_time`). A change to the cost
model (or to how the worker derives T_comp) is then judged on steps already measured, every cell
at once, without running the grid again; only the measured times are facts, the two predictions
(as recorded, and now) are the model's. Grids written before 2026-11-27 22:00 UTC carry no plans.
"""

import json
import statistics
import sys

from absl import app, flags

__all__ = ["replay", "summary"]

FLAGS = flags.FLAGS


def _define_flags():
    flags.DEFINE_string("markdown_out", None, "Write the table to this markdown file too.")


def _compressor(record: dict):
    """The compressor a plan record names: tfcomp's class of that name, made with its arguments."""
    import tfcomp
    name, config = record["compressor"]
    if name not in tfcomp.__all__ or not isinstance(getattr(tfcomp, name), type):
        raise ValueError(f"a plan record's compressor must name a tfcomp compressor class, got {name!r}")
    return getattr(tfcomp, name)(**config)


def replay(grid: dict) -> list:
    """One row per prediction of `grid` (network_validation's JSON: {setting: {"results": [...]}})
    that kept its plan: setting, model, config, measured, predicted as recorded, and now (seconds)."""
    from benchmarks.network_worker import compute_time, with_fitted_overlap_slowdown
    from tfcomp import cost_model as cm
    from tfcomp import planning
    rows = []
    for setting, run in grid.items():
        results = run["results"]
        for r in results:
            if "plan" not in r:
                continue
            plan = planning.Plan.from_record(r["plan"], _compressor(r["plan"]))
            if "dense_gradients" in r:
                gradients = r["dense_gradients"]
                exchange = cm.horovod_dense_finish(gradients["elements"], gradients["ready"], plan.cluster)
            elif r["config"] == "horovod_dense":  # priced after the backward pass: not replayed
                continue
            else:
                if r.get("measured_exchange_s") is not None:
                    plan = with_fitted_overlap_slowdown(plan, r["measured_exchange_s"])
                exchange = planning.predicted_exchange_time(plan)
            now = compute_time(results, r["model"], plan.cluster) - max(plan.ready.values(), default=0.0) + exchange
            rows.append({"setting": setting, "model": r["model"], "config": r["config"],
                         "measured_s": r["measured_s"], "recorded_s": r["predicted_s"], "now_s": now})
    return rows


def _error(row: dict, key: str) -> float:
    return row[key] / row["measured_s"] - 1.0


def summary(rows: list) -> dict:
    """Median and worst |error| of the predictions as recorded and now, over `rows` and per config."""
    out = {}
    for config in [None] + sorted({r["config"] for r in rows}):
        chosen = [r for r in rows if config is None or r["config"] == config]
        out[config or "all"] = {key: (statistics.median(abs(_error(r, key)) for r in chosen),
                                      max(abs(_error(r, key)) for r in chosen))
                                for key in ("recorded_s", "now_s")}
    return out


def _markdown(rows: list, paths: list) -> str:
    lines = [f"Replayed: {', '.join(paths)}", "",
             "| setting | model | config | measured ms | recorded ms | error | now ms | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['model']} | {r['config']} | {1e3 * r['measured_s']:.1f} | "
                     f"{1e3 * r['recorded_s']:.1f} | {100 * _error(r, 'recorded_s'):+.1f}% | "
                     f"{1e3 * r['now_s']:.1f} | {100 * _error(r, 'now_s'):+.1f}% |")
    lines += ["", "| predictions | recorded: median (worst) | now: median (worst) |", "|---|---|---|"]
    for name, figures in summary(rows).items():
        (rm, rw), (nm, nw) = figures["recorded_s"], figures["now_s"]
        lines.append(f"| {name} | {100 * rm:.1f} % ({100 * rw:.1f} %) | {100 * nm:.1f} % ({100 * nw:.1f} %) |")
    return "\n".join(lines) + "\n"


def main(argv):
    paths = argv[1:]
    if not paths:
        raise app.UsageError("give one or more network_validation JSON files")
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [dict(r, setting=f"{r['setting']} ({path.rsplit('/', 1)[-1]})" if len(paths) > 1 else r["setting"])
                     for r in replay(json.load(f))]
    if not rows:
        raise app.UsageError(f"no prediction in {', '.join(paths)} kept its plan (grids before 2026-11-27 22:00 UTC)")
    text = _markdown(rows, paths)
    sys.stdout.write(text)
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
