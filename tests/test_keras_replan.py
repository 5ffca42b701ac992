"""tfcomp.keras.Replan with a stand-in exchange (what it calls after each step, when Keras retraces),
and a dropped plan settled in one process (`LocalCollectives` of 2 workers, a trial on a clock the
test sets): after the trial drops the plan and its residuals are sent, `settle` installs the
all-dense plan and the step traced again holds no op of tfcomp's op library, no tf.switch_case and
no trial variable."""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import tfcomp
import tfcomp.keras
from tensorflow.python.framework import op_def_registry

from tfcomp import ops
from tfcomp.collectives import LocalCollectives
from tfcomp.cost_model import ClusterModel, StrategyTime
from tfcomp.planning import Bucket, Plan
from tfcomp.trial import PlanTrial


class _Trial:
    def __init__(self):
        self.result = {"decided": False, "compressed": True}

    def read(self) -> dict:
        return dict(self.result)


class _Exchange:
    """What Replan calls: calibration pending for `pending` calls of calibrate_step (the last one
    changes the plan), settle() True once `settles` says so, and a trial."""

    def __init__(self, pending: int):
        self.pending, self.trial, self.settles, self.calls = pending, None, False, []
        self.checked = []  # what the next check_prediction calls return (None once empty)

    @property
    def calibration_pending(self) -> bool:
        return self.pending > 0

    def calibrate_step(self) -> bool:
        self.calls.append("calibrate_step")
        self.pending -= 1
        return self.pending == 0

    def settle(self) -> bool:
        self.calls.append("settle")
        settled, self.settles = self.settles, False
        if settled:
            self.trial = None
        return settled

    def replan(self) -> bool:
        self.calls.append("replan")
        return False

    def check_prediction(self, threshold):
        del threshold
        self.calls.append("check_prediction")
        return self.checked.pop(0) if self.checked else None


class _Model:
    optimizer = None

    def __init__(self):
        self.retraced = 0

    def make_train_function(self, force=False):
        assert force
        self.retraced += 1


def test_replan_drives_calibration_then_settles_a_dropped_trial_at_once(monkeypatch):
    exchange = _Exchange(pending=3)
    monkeypatch.setattr(tfcomp.keras, "exchange_of", lambda optimizer: exchange)
    callback, model = tfcomp.keras.Replan(after_steps=4, check_every=None), _Model()
    callback.set_model(model)
    for step in range(3):
        callback.on_train_batch_end(step)
    assert exchange.calls == ["calibrate_step"] * 3 and callback.calibrated_at == 3 and model.retraced == 1
    exchange.calls.clear()
    exchange.trial = _Trial()  # the new plan's trial: settle() asked after every step while it may drop the plan
    callback.on_train_batch_end(3)
    callback.on_train_batch_end(4)
    assert exchange.calls == ["settle", "settle"] and model.retraced == 1
    exchange.trial.result = {"decided": True, "compressed": False}
    exchange.settles = True  # dropped, residuals sent
    callback.on_train_batch_end(5)
    assert model.retraced == 2 and exchange.trial is None
    exchange.calls.clear()
    for step in range(6, 9):
        callback.on_train_batch_end(step)
    assert exchange.calls == ["replan"] and callback.replanned is False  # 4 steps after calibration


def test_replan_stops_asking_once_the_trial_kept_its_plan(monkeypatch):
    exchange = _Exchange(pending=0)
    exchange.trial = _Trial()
    exchange.trial.result = {"decided": True, "compressed": True}
    monkeypatch.setattr(tfcomp.keras, "exchange_of", lambda optimizer: exchange)
    callback = tfcomp.keras.Replan(after_steps=100, check_every=None)
    callback.set_model(_Model())
    for step in range(4):
        callback.on_train_batch_end(step)
    assert exchange.calls == ["settle"]


def test_replan_checks_the_prediction_less_often_while_it_holds(monkeypatch):
    exchange = _Exchange(pending=0)
    calm = {"replanned": False, "changed": False}
    exchange.checked = [calm, calm, {"replanned": True, "changed": True}, calm]
    monkeypatch.setattr(tfcomp.keras, "exchange_of", lambda optimizer: exchange)
    callback, model = tfcomp.keras.Replan(after_steps=2, check_every=3), _Model()
    callback.set_model(model)
    checked_at = []
    for step in range(1, 60):
        before = len(exchange.calls)
        callback.on_train_batch_end(step)
        if "check_prediction" in exchange.calls[before:]:
            checked_at.append(step - 2)  # steps after the re-plan at step 2
    # 3 steps, then 6 and 12 more while it holds; after the re-plan 3 again, then 6, then 12 (None: holds).
    assert checked_at == [3, 9, 21, 24, 30, 42] and model.retraced == 1
    assert len(callback.checks) == 4


def _library_op_types() -> set:
    """The op types of tfcomp's op library (`Tfcomp>Name`; its generated module names each
    `Tfcomp_Name`) but its clock (`TimeAfter`, which the exchange timeline reads and which
    compresses nothing)."""
    types = {name.replace("_", ">", 1) for name in dir(ops.load_library()) if name.startswith("Tfcomp_")}
    assert types and all(op_def_registry.get(t) is not None for t in types)
    return types - {"Tfcomp>TimeAfter"}


def _op_types(step, sizes) -> set:
    """The op types of `step`'s graph for float32 gradients of `sizes`, those of the functions it
    calls (tf.switch_case's and tf.cond's branches) included."""
    graph_def = step.get_concrete_function([tf.TensorSpec([n]) for n in sizes]).graph.as_graph_def()
    return ({node.op for node in graph_def.node}
            | {node.op for function in graph_def.library.function for node in function.node_def})


def _captures_the_trial(step, sizes, trial) -> bool:
    """Whether `step`'s graph reads or writes any of `trial`'s variables."""
    graph = step.get_concrete_function([tf.TensorSpec([n]) for n in sizes]).graph
    handles = [v.handle for v in (trial.step, trial.last_start, trial.seconds, trial.choice, trial.figures)]
    return any(external is handle for external, _ in graph.captures for handle in handles)


def test_a_dropped_plan_settled_leaves_no_compressing_op_in_the_traced_step(rng):
    hvd.init()
    sizes = [3000, 400, 50]
    compressor = tfcomp.DRAGONN(0.05, min_elements=256)
    exchange = tfcomp.GradientExchange(compressor, collectives=LocalCollectives(2))
    exchange.controller.planner.cluster = ClusterModel.unpriced(2)  # figures given: no calibration
    variables = [tf.Variable(tf.zeros([n])) for n in sizes]

    def gradients():
        return [tf.constant(rng.standard_normal(n).astype(np.float32)) for n in sizes]

    def traced():
        return tf.function(lambda gs: exchange(gs, variables), autograph=False)

    step = traced()
    step(gradients())
    entry = exchange.last_entry
    compressing = Plan((Bucket((0,), sizes[0], "allgather", StrategyTime(0.0, 0.0), 0.0),
                        Bucket((1, 2), sizes[1] + sizes[2], "dense", StrategyTime(0.0, 0.0), 0.0)),
                       entry.plan.names, compressor, entry.plan.cluster, sizes=dict(enumerate(sizes)))
    entry = exchange.install(compressing)
    clock = tf.Variable(0.0, dtype=tf.float64)
    entry.runtime.trial = exchange.trial = PlanTrial(1, clock=clock.read_value)
    step = traced()
    library = _library_op_types()
    assert _op_types(step, sizes) & library  # the plan's branch compresses
    trial = entry.runtime.trial
    assert _captures_the_trial(step, sizes, trial)
    settled = []
    for call in range(6):  # 2 steps with the plan, 2 dense, the choice at the fifth: the plan is slower
        step(gradients())
        clock.assign_add(0.4 if call <= 1 else 0.3)
        settled.append(exchange.settle())
        if settled[-1]:
            step = traced()
    assert exchange.controller.trial_dropped_compression and settled.count(True) == 1
    assert exchange.trial is None and not exchange.last_entry.plan.compressed
    step(gradients())
    types = _op_types(step, sizes)
    assert not types & library
    assert not types & {"Case", "StatelessCase"}
    assert not _captures_the_trial(step, sizes, trial)
