"""tfcomp.controller.PlanController alone: a stand-in exchange (the three members the controller
uses), a stand-in planner that plans with `tfcomp.planning` from figures the test sets, and
`LocalCollectives` of K workers (the ranks' gathers return this one's figures) and a clock the test
advances: the first plan all dense until calibrated, the gate on fabricated timelines and step
times, calibration within its budget, re-plans with the measured ready times, the prediction
checked (and a 2x departure shown once), the trial's verdict kept over the job, an all-dense plan
settled. No Horovod collective and no timing of this machine."""

import dataclasses
import functools
import math

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

import tfcomp
from tfcomp import cost_model as cm
from tfcomp import planning
from tfcomp.collectives import LocalCollectives
from tfcomp.controller import BUDGET_STEPS, CALIBRATION_SHARE, GATE_STEPS, MAX_SHARE, PlanController, calibration_gate

WORKERS = 4
SLOW = cm.Network(1e-4, 0.1e9 / 8)  # 100 Mbit/s: compressing pays
FAST = cm.Network(1e-5, 100e9 / 8)  # 100 Gbit/s: dense wins


def _cluster(network=SLOW):
    return cm.ClusterModel(WORKERS, network, network, cm.AffineCost(3e-4, 4e-9))


class _Value:
    """What `.numpy()` is read from (a stand-in for a variable)."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return np.asarray(self.value)


class _Timeline:
    """The exchange timeline's reading: ready seconds by gradient position, bucket ends, steps."""

    def __init__(self, ready, ends, steps: int, window: int = 20):
        self.ready, self.ends = list(ready), list(ends)
        self.steps, self.window = _Value(steps), window

    def read(self) -> dict:
        steps = int(self.steps.numpy())
        return {"steps": steps, "ready_seconds": self.ready if steps else [], "bucket_end_seconds": self.ends}


class _Trial:
    def __init__(self, compressed: bool, decided: bool = True):
        self.compressed, self.decided = compressed, decided
        self.decision_step, self.step = 5, _Value(5 + 100)

    def read(self) -> dict:
        return {"decided": self.decided, "compressed": self.compressed}


class _Runtime:
    def __init__(self, timeline, trial=None, residuals_sent=False, flushes=False):
        self.timeline, self.trial, self.residuals_sent, self._flushes = timeline, trial, residuals_sent, flushes

    def dense_residuals_sent(self, plan) -> bool:
        """Whether the step flushes residuals an all-dense plan has sent (the test says)."""
        del plan
        return self._flushes


@dataclasses.dataclass
class _Entry:
    plan: planning.Plan
    tensors: list
    signature: tuple
    runtime: _Runtime


class _Exchange:
    """The members of GradientExchange that the controller uses, recording every install."""

    def __init__(self, controller, entry):
        self.controller, self.entry, self.installed = controller, entry, []
        controller.bind(self)

    @property
    def last_entry(self):
        return self.entry

    def install(self, plan, residuals_sent=False):
        self.controller.remember_trial_verdict()
        self.installed.append((plan, residuals_sent))
        self.entry = _Entry(plan, self.entry.tensors, self.entry.signature,
                            _Runtime(self.entry.runtime.timeline, residuals_sent=residuals_sent))
        return self.entry

    def reprice(self, cluster, ready):
        self.entry.plan = dataclasses.replace(self.entry.plan, cluster=cluster, ready=ready)


class _Clock:
    """The driver's wall clock, advanced by the test (and by the stand-in calibration's pieces)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Planner:
    """Plans with `tfcomp.planning.make_plan` from `cluster`; calibration between steps is `pieces`
    pieces of `piece_seconds` each on `clock` (each `calibrate_some(seconds)` runs pieces until
    `seconds` are spent, at least one) that end with `calibrated` as the figures."""

    def __init__(self, compressor, cluster, pieces: int = 0, calibrated=None, clock=None, piece_seconds=0.0,
                 earlier_verdict=None):
        self.compressor, self.cluster, self.earlier_verdict, self.verdicts_kept = compressor, cluster, earlier_verdict, []
        self.pieces, self.calibrated, self.clock, self.piece_seconds = pieces, calibrated, clock, piece_seconds
        self.calibration_seconds, self.ready_cached, self.started = 0.0, False, False
        self.kept, self.recalibrations, self.asked, self.steps_given = [], 0, [], []

    @property
    def calibration_pending(self) -> bool:
        return self.started and self.pieces > 0

    def start_calibration(self, tensors):
        del tensors
        self.started = True

    def calibrate_some(self, seconds) -> bool:
        self.asked.append(seconds)
        ran = min(self.pieces, max(1, math.ceil(seconds / self.piece_seconds)) if self.piece_seconds else self.pieces)
        self.pieces -= ran
        if self.clock is not None:
            self.clock.now += ran * self.piece_seconds
        self.calibration_seconds += ran * self.piece_seconds
        if self.pieces == 0:
            self.cluster = self.calibrated
        return self.pieces == 0

    def plan(self, tensors, signature, ready_seconds=None, step=None):
        del signature
        self.steps_given.append(step)
        step_seconds, margin = step if step is not None else (None, planning.COMPRESSION_MARGIN)
        return planning.make_plan(tensors, self.compressor, self.cluster, ready_seconds=ready_seconds,
                                  step_seconds=step_seconds, margin=margin)

    def dense_plan(self, tensors, signature):
        del signature
        return planning.dense_plan(tensors, self.compressor, cm.ClusterModel.unpriced(WORKERS))

    def keep_ready_times(self, tensors, ready):
        self.kept.append((list(tensors), list(ready)))

    def dense_verdict(self, tensors):
        del tensors
        return self.earlier_verdict

    def keep_dense_verdict(self, tensors, potential_gain):
        self.verdicts_kept.append((list(tensors), potential_gain))

    def recalibrate(self, tensors):
        del tensors
        self.recalibrations += 1
        return self.cluster


def _setup(rng, plan_network=SLOW, planner_network=SLOW, trial=None, steps=30, ends=None, workers=WORKERS,
           compressor=None, fixed_plan=None, **planner_args):
    """(controller, stand-in exchange, tensors, measured ready times per tensor): 4 gradients of
    2^18 to 2^20 elements, ready at random times, the running plan planned on `plan_network`."""
    compressor = compressor or tfcomp.DRAGONN(0.01)
    sizes = rng.integers(2**18, 2**20, size=4)
    tensors = [(int(p), f"t{p}", int(sizes[p])) for p in reversed(range(4))]
    ready_by_position = np.sort(rng.uniform(0.0, 0.05, size=4))[::-1]
    plan = planning.make_plan(tensors, compressor, _cluster(plan_network))
    timeline = _Timeline(ready_by_position, ends if ends is not None else [0.1], steps)
    planner = _Planner(compressor, _cluster(planner_network), **planner_args)
    controller = PlanController(planner, LocalCollectives(workers), fixed_plan=fixed_plan)
    exchange = _Exchange(controller, _Entry(plan, tensors, (), _Runtime(timeline, trial)))
    return controller, exchange, tensors, [float(ready_by_position[p]) for p, _, _ in tensors]


def test_replan_installs_the_plan_of_the_measured_ready_times_and_keeps_them(rng):
    controller, exchange, tensors, ready = _setup(rng, plan_network=FAST)
    assert not exchange.entry.plan.compressed  # planned dense on a fast network, which turned out slow
    assert controller.replan(min_gain=0.0) is True
    expected = planning.make_plan(tensors, controller.compressor, _cluster(), ready_seconds=ready)
    (installed, residuals_sent), = exchange.installed
    assert installed.digest() == expected.digest() and installed.compressed and residuals_sent is False
    assert installed.ready == expected.ready == {p: r for (p, _, _), r in zip(tensors, ready)}
    assert controller.planner.kept == [(tensors, ready)]
    assert controller.replan(min_gain=0.0) is False  # the same plan again: nothing installed
    assert len(exchange.installed) == 1 and exchange.entry.plan.ready == expected.ready


def test_replan_after_a_trial_dropped_compression_keeps_every_bucket_dense(rng):
    controller, exchange, tensors, ready = _setup(rng, trial=_Trial(compressed=False))
    assert exchange.entry.plan.compressed
    changed = controller.replan(min_gain=0.0)
    new = planning.make_plan(tensors, controller.compressor, _cluster(), ready_seconds=ready).all_dense()
    running = dataclasses.replace(exchange.entry.plan.all_dense(), cluster=new.cluster, ready=new.ready)
    assert changed == (new.digest() != running.digest() and planning.pays_to_replace(running, new, 0.0))
    assert all(not plan.compressed for plan, _ in exchange.installed)


def test_the_trial_verdict_is_a_query_and_is_remembered_only_when_told(rng):
    controller, exchange, _, _ = _setup(rng, trial=_Trial(compressed=False))
    for _ in range(3):  # asking changes nothing
        assert controller.trial_dropped_compression is True
    exchange.entry.runtime.trial = _Trial(compressed=True)  # a new trial, the dropped one not remembered
    assert controller.trial_dropped_compression is False
    exchange.entry.runtime.trial = _Trial(compressed=False)
    controller.remember_trial_verdict()
    exchange.entry.runtime.trial = _Trial(compressed=True)
    assert controller.trial_dropped_compression is True  # remembered for the job
    controller, exchange, _, _ = _setup(rng, trial=_Trial(compressed=True))
    controller.remember_trial_verdict()
    assert controller.trial_dropped_compression is False


def test_installing_a_plan_remembers_the_verdict_of_the_one_it_replaces(rng):
    controller, exchange, _, _ = _setup(rng, trial=_Trial(compressed=False))
    exchange.install(exchange.entry.plan)
    assert exchange.entry.runtime.trial is None and controller.trial_dropped_compression is True


def test_replan_needs_a_measured_step_and_does_nothing_where_the_planner_does_not_plan(rng):
    controller, _, _, _ = _setup(rng, steps=0)
    with pytest.raises(RuntimeError, match="needs the ready times of at least one training step"):
        controller.replan()
    for case in ({"workers": 1}, {"compressor": tfcomp.DRAGONN(0.01, planning="off")}):
        controller, exchange, _, _ = _setup(rng, plan_network=FAST, **case)
        assert controller.replan(min_gain=0.0) is False and exchange.installed == []
        assert controller.check_prediction() is None and controller.settle() is False
    controller, exchange, _, _ = _setup(rng, plan_network=FAST)
    controller.fixed_plan = exchange.entry.plan
    assert controller.replan(min_gain=0.0) is False and controller.trial_steps == 0
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"min_gain must be a fraction in \[0, 1\)"):
            controller.replan(min_gain=bad)


def _predicted(plan, tensors, ready) -> float:
    return planning.predicted_exchange_time(dataclasses.replace(plan, ready={p: r for (p, _, _), r in zip(tensors, ready)}))


def test_check_prediction_keeps_a_plan_on_time_and_fits_the_slowdown_to_a_late_one(rng):
    controller, exchange, tensors, ready = _setup(rng)
    on_time = _predicted(exchange.entry.plan, tensors, ready)
    exchange.entry.runtime.timeline.ends = [on_time * 0.5, on_time]
    result = controller.check_prediction()
    assert result["replanned"] is False and result["changed"] is False and result["recalibrated"] is False
    np.testing.assert_allclose([result["predicted_seconds"], result["departure"]], [on_time, 0.0], atol=1e-12)
    assert exchange.installed == []
    late = 2.0 * on_time
    exchange.entry.runtime.timeline.ends = [late]
    running = dataclasses.replace(exchange.entry.plan, ready={p: r for (p, _, _), r in zip(tensors, ready)})
    result = controller.check_prediction()
    assert result["replanned"] is True
    assert result["overlap_slowdown"] == planning.fit_overlap_slowdown(running, late)  # the recalibration's figures are the same
    np.testing.assert_allclose(result["departure"], late / on_time - 1.0, rtol=1e-9)
    assert controller.planner.cluster.overlap_slowdown == result["overlap_slowdown"]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="threshold must be a fraction > 0"):
            controller.check_prediction(bad)


def test_check_prediction_waits_for_the_window_and_reports_a_dropped_plan_without_replanning(rng):
    controller, exchange, tensors, ready = _setup(rng, steps=5)
    assert controller.check_prediction() is None  # 5 steps of a 20-step window
    controller, exchange, tensors, ready = _setup(rng, trial=_Trial(compressed=False))
    late = 10.0 * _predicted(exchange.entry.plan.all_dense(), tensors, ready)
    exchange.entry.runtime.timeline.ends = [late]
    result = controller.check_prediction()
    assert result["departure"] > 0.25 and result["replanned"] is False and exchange.installed == []
    assert controller.planner.recalibrations == 0


def test_check_prediction_calibrates_again_at_most_once_a_job(rng):
    controller, exchange, tensors, ready = _setup(rng)
    controller.planner.cluster = dataclasses.replace(_cluster(), overlap_slowdown=1.0)
    unexplainable = 1e3 * _predicted(exchange.entry.plan, tensors, ready)  # beyond any slowdown the fit tries
    exchange.entry.runtime.timeline.ends = [unexplainable]
    assert controller.check_prediction()["recalibrated"] is True
    exchange.entry.runtime.timeline.ends = [1e3 * _predicted(exchange.entry.plan, tensors, ready)]
    result = controller.check_prediction()
    assert result is None or result["recalibrated"] is False
    assert controller.planner.recalibrations == 1


def test_measured_plan_is_the_running_plan_with_the_latest_ready_times(rng):
    controller, exchange, tensors, ready = _setup(rng, ends=[0.2, 0.3], trial=_Trial(compressed=False))
    plan, end = controller.measured_plan()
    assert end == 0.3 and plan.ready == {p: r for (p, _, _), r in zip(tensors, ready)}
    assert plan.digest() == exchange.entry.plan.all_dense().digest()
    controller, _, _, _ = _setup(rng, steps=0)
    assert controller.measured_plan() is None


def test_settle_installs_the_all_dense_plan_again_once_its_residuals_are_sent(rng):
    controller, exchange, _, _ = _setup(rng, plan_network=FAST)
    assert controller.settle() is False  # its step flushes nothing
    exchange.entry.runtime._flushes = True
    assert controller.settle() is True
    (plan, residuals_sent), = exchange.installed
    assert residuals_sent is True and not plan.compressed
    assert controller.settle() is False  # residuals sent: settled


def test_a_controller_serves_one_exchange(rng):
    controller, exchange, _, _ = _setup(rng)
    controller.bind(exchange)  # again: the same one
    with pytest.raises(ValueError, match="one exchange"):
        _Exchange(controller, exchange.entry)


def test_the_exchange_takes_a_controller_of_its_compressor_and_delegates_to_it(rng):
    hvd.init()
    compressor = tfcomp.DRAGONN(0.01)
    planner = _Planner(compressor, _cluster())
    controller = PlanController(planner, LocalCollectives(1))
    exchange = tfcomp.GradientExchange(compressor, controller=controller)
    assert exchange.controller is controller
    assert exchange.calibration_pending is False and exchange.calibration_seconds == 0.0
    with pytest.raises(ValueError, match="not both"):
        tfcomp.GradientExchange(compressor, controller=PlanController(planner, LocalCollectives(1)),
                                plan=planning.dense_plan([], compressor, _cluster()))
    with pytest.raises(ValueError, match="not this exchange's compressor"):
        tfcomp.GradientExchange(tfcomp.DRAGONN(0.02), controller=PlanController(planner, LocalCollectives(1)))
    variable = tf.Variable(tf.zeros([5000]))
    gradient = tf.constant(rng.standard_normal(5000).astype(np.float32))
    exchange([gradient], [variable])
    assert exchange.last_entry.plan is exchange.plan and exchange.trial is None  # one worker: not tried
    assert exchange.calibration_pending is False and exchange.calibrate_step() is False and exchange.calibrate() is False


def test_a_second_calibration_is_spent_only_where_a_network_could_change_the_plan():
    """check_prediction calibrates again only where the network that alone would explain the measured
    exchange makes a different kind of plan: for an all-dense plan measured a little late (a loaded
    CPU) it does not; measured 50x late (the network far slower than calibrated) it does; a plan
    that compresses may always turn dense."""
    compressor = tfcomp.DRAGONN(0.01)
    cluster = _cluster(cm.Network(1e-4, 10e9 / 8))
    tensors = [(i, f"t{i}", 2**20) for i in reversed(range(4))]
    ready = [0.0, 0.01, 0.02, 0.03]
    dense = planning.make_plan(tensors, compressor, cluster, ready_seconds=ready)
    assert not dense.compressed  # 10 Gbit/s: dense wins
    predicted = planning.predicted_exchange_time(dense)
    controller = PlanController(_Planner(compressor, cluster), LocalCollectives(WORKERS))
    could_change = functools.partial(controller._network_could_change_the_plan, _Entry(dense, tensors, (), None))
    assert could_change(dense, ready, 1.3 * predicted) is False
    assert could_change(dense, ready, 0.5 * predicted) is False
    assert could_change(dense, ready, 50.0 * predicted) is True
    compressing = planning.make_plan(tensors, compressor, _cluster(SLOW), ready_seconds=ready)
    assert compressing.compressed
    assert could_change(compressing, ready, planning.predicted_exchange_time(compressing)) is True


# -- the first plan, the gate and calibration between steps ----------------------------------------


def _waiting(rng, exposed_fraction: float, spread: float = 0.0, pieces: int = 3, piece_seconds: float = 0.0,
             step: float = 0.1, workers: int = WORKERS, earlier_verdict=None):
    """(controller, stand-in exchange, tensors, clock, step seconds the driver will time): the first
    plan made by the controller (all dense, calibration waiting for the gate), its timeline's
    exchange ending `exposed_fraction` of a `step`-second step after its last gradient, and
    GATE_STEPS step times spread around `step` with interquartile range about `spread` x step."""
    compressor = tfcomp.DRAGONN(0.01)
    sizes = rng.integers(2**18, 2**20, size=4)
    tensors = [(int(p), f"t{p}", int(sizes[p])) for p in reversed(range(4))]
    clock = _Clock()
    planner = _Planner(compressor, None, pieces=pieces, calibrated=_cluster(SLOW), clock=clock,
                       piece_seconds=piece_seconds, earlier_verdict=earlier_verdict)
    controller = PlanController(planner, LocalCollectives(workers), clock=clock)
    plan = controller.first_plan(tensors, ())
    ready = np.sort(rng.uniform(0.0, 0.5 * step, size=4))[::-1]
    timeline = _Timeline(ready, [float(ready.max()) + exposed_fraction * step], steps=GATE_STEPS)
    exchange = _Exchange(controller, _Entry(plan, tensors, (), _Runtime(timeline)))
    offsets = np.linspace(-1.0, 1.0, GATE_STEPS) * spread  # IQR of this linear spread: spread / 2 ...
    steps = step * (1.0 + 2.0 * offsets[rng.permutation(GATE_STEPS)])  # ... doubled: about `spread`
    return controller, exchange, tensors, clock, steps


def _drive(controller, clock, step_seconds) -> list:
    """The driver's call after a first step, then after one step of each of `step_seconds`: what
    each calibrate_step returned."""
    changed = [controller.calibrate_step()]
    for seconds in step_seconds:
        clock.now += seconds
        changed.append(controller.calibrate_step())
    return changed


def test_the_first_plan_is_all_dense_measures_nothing_and_says_how_calibration_runs(rng, capsys):
    capsys.readouterr()
    controller, exchange, tensors, _, _ = _waiting(rng, 0.5)
    assert not exchange.entry.plan.compressed and [b.strategy for b in exchange.entry.plan.buckets] == ["dense"]
    assert controller.calibration_pending and not controller.planner.started and controller.planner.asked == []
    shown = capsys.readouterr().out
    assert "dense" in shown and "tfcomp.keras.Replan()" in shown and "calibrate_step()" in shown
    assert controller.replan() is False and controller.check_prediction() is None  # no figures yet
    assert controller.first_plan(tensors, ()).digest() == exchange.entry.plan.digest()  # said once
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError, match="after that call"):
        PlanController(_Planner(controller.compressor, None), LocalCollectives(WORKERS)).calibrate()


@pytest.mark.parametrize("case", [{"strategy": "allgather"}, {"planning": "off"}])
def test_a_forced_strategy_or_planning_off_plans_at_once_as_before(rng, case):
    compressor = tfcomp.DRAGONN(0.01, **case)
    tensors = [(p, f"t{p}", 2**20) for p in reversed(range(3))]
    controller = PlanController(_Planner(compressor, _cluster()), LocalCollectives(WORKERS))
    plan = controller.first_plan(tensors, ())
    assert plan.digest() == planning.make_plan(tensors, compressor, _cluster()).digest()
    assert controller.calibration_pending is False


def test_the_gate_keeps_every_gradient_dense_where_the_exposed_exchange_is_under_the_margin(rng, capsys):
    controller, exchange, _, clock, steps = _waiting(rng, exposed_fraction=0.03)
    capsys.readouterr()
    assert _drive(controller, clock, steps[:-1]) == [False] * GATE_STEPS
    assert controller.gate is None and controller.calibration_pending  # one step time short
    assert _drive(controller, clock, steps[-1:]) == [False, False]
    gate = controller.gate
    median, (lower, upper) = np.median(steps), np.percentile(steps, [25, 75])
    np.testing.assert_allclose([gate.step_seconds, gate.spread], [median, (upper - lower) / median], rtol=1e-12,
                               atol=1e-12)
    timeline = exchange.entry.runtime.timeline
    np.testing.assert_allclose(gate.exposed_seconds, timeline.ends[0] - max(timeline.ready), rtol=1e-12)
    assert not gate.calibrates and gate.share == 0.0 and not controller.calibration_pending
    assert not controller.planner.started and controller.planner.asked == [] and exchange.installed == []
    assert "compression cannot gain the 5 % margin here; every gradient is sent dense" in capsys.readouterr().out
    assert _drive(controller, clock, steps) == [False] * (GATE_STEPS + 1) and controller.planner.asked == []
    assert controller.replan() is False and controller.check_prediction() is None and controller.calibrate() is False


def test_the_gate_wants_a_larger_gain_where_the_steps_are_noisy(rng):
    # 10 % exposed: over the 5 % margin on steady steps, under twice a 10 % spread on noisy ones.
    for spread, calibrates in ((0.0, True), (0.1, False)):
        controller, _, _, clock, steps = _waiting(rng, exposed_fraction=0.1, spread=spread)
        _drive(controller, clock, steps)
        gate = controller.gate
        assert gate.calibrates is calibrates and gate.margin == pytest.approx(max(0.05, 2.0 * gate.spread))
        assert controller.planner.started is calibrates


@pytest.mark.parametrize("exposed, spread", [(0.0, 0.0), (0.049, 0.0), (0.051, 0.0), (0.1, 0.04), (0.1, 0.06),
                                             (0.3, 0.01), (0.9, 0.0), (1.5, 0.2)])
def test_calibration_gate_rule(exposed, spread):
    gate = calibration_gate(exposed * 0.2, 0.2, spread)
    margin = max(0.05, 2.0 * spread)
    assert gate.margin == margin and gate.calibrates is (exposed >= margin)
    assert gate.share == pytest.approx(min(max(CALIBRATION_SHARE, exposed / 2.0), MAX_SHARE) if exposed >= margin else 0.0)
    assert gate.potential_gain == pytest.approx(exposed)


def test_calibration_runs_within_its_share_of_the_last_steps_and_then_installs_its_plan(rng, capsys):
    step, piece = 0.1, 0.4
    controller, exchange, tensors, clock, steps = _waiting(rng, exposed_fraction=0.3, pieces=12, piece_seconds=piece,
                                                           step=step)
    changed = _drive(controller, clock, steps)
    share = controller.gate.share
    assert controller.gate.calibrates and share == pytest.approx(0.15) and changed == [False] * (GATE_STEPS + 1)
    spent = []  # calibration seconds of each call since the gate, as the rule counts them
    while controller.calibration_pending:
        assert len(spent) < 1000
        pieces_before = controller.planner.pieces
        clock.now += step
        changed = controller.calibrate_step()
        ran = pieces_before - controller.planner.pieces
        window = min(len(spent) + 1 + GATE_STEPS, BUDGET_STEPS)
        budget = share * window * step - sum(spent[-(BUDGET_STEPS - 1):])
        # A piece runs only while the window's calibration time is below its share of the steps' time.
        assert (ran > 0) is (budget > 0.0)
        if ran:
            assert controller.planner.asked[-1] == pytest.approx(budget)
        spent.append(ran * piece)
    assert changed is True and controller.gate.calibrates
    (installed, _), = exchange.installed
    ready = exchange.entry.runtime.timeline.ready
    # The plan must gain the gate's margin of the step the gate measured.
    assert controller.planner.steps_given[-1] == (controller.gate.step_seconds, controller.gate.margin)
    expected = planning.make_plan(tensors, controller.compressor, _cluster(SLOW),
                                  ready_seconds=[float(ready[p]) for p, _, _ in tensors],
                                  step_seconds=controller.gate.step_seconds, margin=controller.gate.margin)
    assert installed.digest() == expected.digest() and installed.compressed
    assert "one retrace of the training step" in capsys.readouterr().out
    assert controller.calibrate_step() is False and controller.calibrate() is False


def test_calibrate_runs_all_of_it_at_once_without_the_gate(rng):
    controller, exchange, tensors, _, _ = _waiting(rng, exposed_fraction=0.0, pieces=5)
    assert controller.calibrate() is True and not controller.calibration_pending and controller.gate is None
    assert controller.planner.asked == [float("inf")] and controller.planner.steps_given[-1] is None
    (installed, _), = exchange.installed
    assert installed.compressed and installed.cluster == _cluster(SLOW)


def test_calibration_where_compressing_does_not_pay_keeps_the_dense_plan_and_lends_it_the_figures(rng):
    controller, exchange, tensors, _, _ = _waiting(rng, exposed_fraction=0.5, pieces=1)
    controller.planner.calibrated = _cluster(FAST)
    assert controller.calibrate() is False and exchange.installed == []
    assert exchange.entry.plan.cluster == _cluster(FAST) and not exchange.entry.plan.compressed
    assert controller.planner.verdicts_kept == []  # calibrated at once: no step measured to keep the verdict at


def test_a_dense_verdict_after_the_gate_is_kept_with_the_exposed_share_it_was_reached_at(rng):
    controller, exchange, tensors, clock, steps = _waiting(rng, exposed_fraction=0.4, pieces=1)
    controller.planner.calibrated = _cluster(FAST)
    changed = _drive(controller, clock, steps)
    while controller.calibration_pending:
        clock.now += 0.1
        changed.append(controller.calibrate_step())
    assert not any(changed) and exchange.installed == [] and not exchange.entry.plan.compressed
    (kept_tensors, gain), = controller.planner.verdicts_kept
    assert kept_tensors == tensors and gain == pytest.approx(controller.gate.potential_gain)
    assert gain == pytest.approx(0.4, rel=1e-6)


@pytest.mark.parametrize("earlier, holds", [(0.4, True), (0.33, True), (0.3, False), (0.1, False)])
def test_an_earlier_dense_verdict_holds_unless_the_exchange_is_more_exposed_now(rng, capsys, earlier, holds):
    # Exposed 40 % now: an earlier verdict holds down to 40 / VERDICT_TOLERANCE = 32 %.
    controller, exchange, _, clock, steps = _waiting(rng, exposed_fraction=0.4, earlier_verdict=earlier)
    capsys.readouterr()
    _drive(controller, clock, steps)
    gate = controller.gate
    assert gate.calibrates is not holds and controller.planner.started is not holds
    assert (gate.earlier_gain == earlier) if holds else gate.earlier_gain is None
    assert ("found compressing not paying" in capsys.readouterr().out) is holds
    if holds:
        assert not controller.calibration_pending and exchange.installed == [] and gate.share == 0.0


def test_a_departure_beyond_2x_is_shown_once_and_only_on_rank_0(rng, capsys):
    controller, exchange, tensors, ready = _setup(rng)
    late = 3.0 * _predicted(exchange.entry.plan, tensors, ready)
    exchange.entry.runtime.timeline.ends = [late]
    capsys.readouterr()
    controller.check_prediction()
    shown = capsys.readouterr().out
    assert shown.count("tfcomp: predicted") == 1 and "measured" in shown and "re-planned" in shown
    exchange.entry.runtime.timeline.ends = [3.0 * late]
    controller.check_prediction()
    assert "tfcomp: predicted" not in capsys.readouterr().out
    controller, exchange, tensors, ready = _setup(rng)
    controller.collectives.rank = 1
    exchange.entry.runtime.timeline.ends = [late]
    controller.check_prediction()
    assert capsys.readouterr().out == ""
