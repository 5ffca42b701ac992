"""Worker of benchmarks/network_validation.py: measured against predicted time per training step.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.network_worker --out RESULT.json

Four models, each trained with a custom tf.function step (forward, backward, exchange, SGD update)
on a fixed batch of 32 per worker:

  giant        Dense 512 -> 512 (relu) -> 16384 classes: an extreme-classification layer of
               8.4 M weights, 004's 4096 x 30938 scaled down; 8.67 M parameters in 4 tensors
  many_small   40 Dense 128 -> 128 (tanh) layers and a Dense 128 -> 10: 0.66 M parameters in 82 tensors
  cnn, vit     the time-to-accuracy models of examples/models.py on 28x28x1 images (3.3 M parameters
               in 22 tensors, 1.6 M in 46), trained here with plain SGD like the others

and these configurations, interleaved round by round (every round runs each configuration for
one untimed step, then --steps timed steps, 4x as many for many_small; after a warm-up that runs past
tfcomp's trial of its plan and one untimed round, the result is the median over --rounds rounds, 3x
as many for many_small, of the time per timed step; each round starts one configuration later than
the one before). The untimed step, the first after another configuration's steps, is left out
because training never switches (its samples are kept as switch_step_samples_s; over the 150 cells
of the pinned K = 2 grid it took a median 1.03x the timed steps, many_small's compute-only step up
to 1.5x):

  compute        the same step without any exchange (plain SGD)
  compute_synced the same step ending in one allreduce of one float (the loss): the compute time
                 T_comp as synchronous training sees it, each step waiting for the slower worker
  horovod_dense  hvd.DistributedOptimizer(SGD, compression=hvd.Compression.none): plain Horovod
  dragonn        tfcomp DRAGONN(0.001) forced to compressed allgather in cost-model buckets
  plan           tfcomp DRAGONN(0.001) with the default plan (the cost model chooses per bucket)
  per_tensor     (many_small only) DRAGONN(0.001, planning="off"): every tensor of >= 1024
                 elements compressed on its own, as layer-wise compression does
  forced_dense   (only where --configs names it) DRAGONN(0.001, strategy="dense"): tfcomp's dense
                 path alone, against plain Horovod

The tfcomp configurations re-plan after their first trial with the gradients' ready times measured
in those steps (`GradientExchange.replan`, what `tfcomp.keras.Replan` does in model.fit), trace the
step again where the plan changed, and run on until the new plan's trial has decided; after the
exchange timeline's window of steps they check the prediction as `Replan` does every 20 steps
(`GradientExchange.check_prediction`, which may re-plan, or install an all-dense plan again without
the flush of residuals it has sent) and run any new plan the same way; then, over the window's
steps, the overlap slowdown (how much slower transfers run beside the backward pass: on this
machine the workers' collectives and compute share its cores) is fitted to the measured exchange
end, as `GradientExchange.check_prediction` does in training.

Predictions: T_comp is the measured compute_synced step less the cost model's time for its
one-float allreduce, no less than the plain compute step (`compute_time`; the plain compute step
where compute_synced was not run); the exchange's time
comes from the figures calibration measured at the start of this job. With the measured ready
times (seconds from the step's first gradient to each gradient; their span, the backward pass
after its first gradient, is part of T_comp): T = T_comp - span + when the exchange ends after the
first gradient, the plan's `predicted_exchange_time` (dense buckets overlapping the backward pass),
for horovod_dense `cost_model.horovod_dense_finish` (Horovod's fusion buffer replayed over the same
ready times and overlap slowdown, those of the plan configuration). Without them (a tfcomp configuration that makes no
plan of its own): 000's T = T_comp + exchange after the backward pass. Rank 0 writes the JSON.
"""

import argparse
import dataclasses
import json
import statistics
import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import tfcomp
from examples.models import build_model
from tfcomp import cost_model as cm
from tfcomp import planning
from tfcomp import strategies as st
from tfcomp.collectives import barrier as make_barrier

__all__ = []

BATCH = 32
RATIO = 0.001


def giant_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu", input_shape=(512,)),
                                tf.keras.layers.Dense(16384)])


def many_small_model():
    layers = [tf.keras.layers.Dense(128, activation="tanh", input_shape=(128,))]
    layers += [tf.keras.layers.Dense(128, activation="tanh") for _ in range(39)] + [tf.keras.layers.Dense(10)]
    return tf.keras.Sequential(layers)


IMAGE = (28, 28, 1)
# {name: (build, input shape without the batch, classes)}
MODELS = {"giant": (giant_model, (512,), 16384), "many_small": (many_small_model, (128,), 10),
          "cnn": (lambda: build_model("cnn", IMAGE, 10), IMAGE, 10),
          "vit": (lambda: build_model("vit", IMAGE, 10), IMAGE, 10)}
# many_small steps are short and noisy: each round times 4x as many, and it runs 3x as many rounds.
STEP_FACTOR = {"giant": 1, "many_small": 4, "cnn": 1, "vit": 1}
ROUND_FACTOR = {"giant": 1, "many_small": 3, "cnn": 1, "vit": 1}


SYNCED = "synced"  # no exchange, one tiny allreduce at the end of the step
COMPUTE_CONFIGS = {"compute": None, "compute_synced": SYNCED}  # the steps without a gradient exchange


def configurations(model_name):
    configs = {
        **COMPUTE_CONFIGS,
        "horovod_dense": lambda opt: hvd.DistributedOptimizer(opt, compression=hvd.Compression.none),
        "dragonn": lambda opt: hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(RATIO, strategy="allgather")),
        "plan": lambda opt: hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(RATIO)),
    }
    if model_name == "many_small":
        configs["per_tensor"] = lambda opt: hvd.DistributedOptimizer(
            opt, compression=tfcomp.DRAGONN(RATIO, planning="off"))
    return configs


# Run only where --configs names them: diagnostics, not part of the grid.
EXTRA_CONFIGS = {
    "forced_dense": lambda opt: hvd.DistributedOptimizer(opt, compression=tfcomp.DRAGONN(RATIO, strategy="dense")),
}


class Trainer:
    """One model and optimizer with a compiled step on a fixed batch."""

    def __init__(self, model_name, wrap):
        build, inputs, classes = MODELS[model_name]
        tf.keras.utils.set_random_seed(1)
        self.model = build()
        rng = np.random.default_rng(100 + hvd.rank())
        self.x = tf.constant(rng.standard_normal((BATCH,) + inputs).astype(np.float32))
        self.y = tf.constant(rng.integers(0, classes, BATCH))
        inner = tf.keras.optimizers.SGD(0.01)
        self.optimizer = inner if wrap in (None, SYNCED) else wrap(inner)
        self.wrap = wrap
        self.step = self._traced_step()
        self.fitted_plan = None  # the plan run, with measured ready times and overlap slowdown (warm_up)
        self.measured_exchange_s = None  # when its exchange ended, what the slowdown was fitted to
        self.trials = []  # each trial's result (tfcomp.trial.PlanTrial.read) once decided, in warm-up

    def _traced_step(self):
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(self.y, self.model(self.x))
            self.optimizer.minimize(loss, self.model.trainable_variables, tape=tape)
            if self.wrap == SYNCED:
                # After the update (the read of the step counter follows the optimizer's write of it).
                with tf.control_dependencies([self.optimizer.iterations.read_value()]):
                    return hvd_tf.allreduce(tf.reshape(loss, [1]), op=hvd_tf.Sum, name="compute_synced")[0]
            return loss

        return step

    def warm_up(self):
        """Traces, calibrates (at once, after the first steps) and plans; where tfcomp tries its plan in training (`tfcomp.trial`:
        some steps with the plan, some dense), runs on until the trial has decided; then re-plans
        with the ready times measured so far (tracing the step again where the plan changed) and
        runs on until that plan's trial has decided too, so that the timed rounds measure the plan
        it keeps; then, after the timeline's window of steps, checks the prediction as `Replan`
        does every 20 steps (`GradientExchange.check_prediction`: a re-plan where the exchange
        departs from it, or the all-dense plan installed again without a flush of residuals it has
        sent), and runs the new plan in the same way where that changed it. Every rank decides at
        the same step."""
        self.run(5)
        if isinstance(self.exchange, tfcomp.GradientExchange) and self.exchange.calibrate():
            self._run_new_plan()  # calibrated at once: the first plan sent everything dense, measuring nothing
        self._until_trial_decided()
        if not isinstance(self.exchange, tfcomp.GradientExchange):
            return
        if self.exchange.replan():
            self._run_new_plan()
        if self.exchange.compressor.planning == "auto":
            self.run(self.exchange.timeline.window)
            checked = self.exchange.check_prediction()
            if checked is not None and checked["changed"]:
                self._run_new_plan()
            self._fit_overlap_slowdown()

    def _run_new_plan(self):
        """Traces the step again for the exchange's new plan and runs it until its trial (if any) has
        decided; where the plan is all dense, traces it again without the flush of residuals its
        first step sent (`GradientExchange.settle`, as `tfcomp.keras.Replan` does)."""
        self.step = self._traced_step()
        self.run(2)
        if self.exchange.settle():
            self.step = self._traced_step()
        self._until_trial_decided()

    def _fit_overlap_slowdown(self):
        """Runs the exchange timeline's window of steps and fits the overlap slowdown to them
        (`planning.fit_overlap_slowdown`: how much slower transfers ran beside the backward pass),
        as `GradientExchange.check_prediction` does in training, but whatever the departure and
        without re-planning: `fitted_plan` is the plan run (all dense where its trial dropped it)
        with those steps' ready times and exchange end, the latest over the ranks
        (`GradientExchange.measured_plan`; the end kept as `measured_exchange_s`)."""
        self.run(self.exchange.timeline.window)
        running, end = self.exchange.measured_plan()
        self.fitted_plan = with_fitted_overlap_slowdown(running, end)
        self.measured_exchange_s = end

    @property
    def plan(self):
        """The plan its predictions price: the fitted one where warm_up fitted it, else the exchange's."""
        return self.fitted_plan or self.exchange.plan

    def _until_trial_decided(self):
        trial = getattr(self.exchange, "trial", None)
        while trial is not None and not trial.read()["decided"]:
            self.run(1)
        if trial is not None:
            self.trials.append(trial.read())

    def run(self, steps):
        for _ in range(steps):
            loss = self.step()
        return float(loss.numpy())

    @property
    def exchange(self):
        try:
            return tfcomp.exchange_of(self.optimizer)
        except TypeError:  # plain Horovod, or no wrapper
            return None

    def parameters(self):
        return sum(int(v.shape.num_elements()) for v in self.model.trainable_variables)


barrier = make_barrier(hvd_tf.global_process_set, "network_worker_barrier")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="giant,many_small")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    args = parser.parse_args()
    # Two workers share two cores: one thread each for ops, two for independent ops (Horovod's
    # collectives are asynchronous and wait in the inter-op pool).
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    trainers = {}
    chosen = args.configs.split(",") if args.configs else None
    extra = {name: wrap for name, wrap in EXTRA_CONFIGS.items() if chosen and name in chosen}
    for model_name in args.models.split(","):
        for config, wrap in {**configurations(model_name), **extra}.items():
            if chosen and config not in chosen:
                continue
            trainer = Trainer(model_name, wrap)
            trainer.warm_up()
            trainers[model_name, config] = trainer
    samples = {key: [] for key in trainers}
    switch_samples = {key: [] for key in trainers}
    steps = {key: args.steps * STEP_FACTOR[key[0]] for key in trainers}
    for key, trainer in trainers.items():  # one untimed round: every configuration warm, in round order
        barrier()
        trainer.run(steps[key])
    order = list(trainers)
    for round_number in range(args.rounds * max(ROUND_FACTOR.values())):
        # Each round starts one configuration further on, so that none always runs in the same place.
        shift = round_number % len(order)
        for key in order[shift:] + order[:shift]:
            if round_number >= args.rounds * ROUND_FACTOR[key[0]]:
                continue
            trainer = trainers[key]
            barrier()
            start = time.perf_counter()
            trainer.run(1)  # the first step after another configuration's: its switch is left out
            switched = time.perf_counter()
            trainer.run(steps[key])
            samples[key].append((time.perf_counter() - switched) / steps[key])
            switch_samples[key].append(switched - start)
    results = []
    for (model_name, config), trainer in trainers.items():
        results.append({"model": model_name, "config": config, "parameters": trainer.parameters(), "trials": trainer.trials,
                        "measured_s": statistics.median(samples[model_name, config]),
                        "samples_s": samples[model_name, config],
                        "switch_step_samples_s": switch_samples[model_name, config]})
    predict(results, trainers)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"workers": hvd.size(), "cpu_allocator": tfcomp.calibration.cpu_allocator(), "results": results}, f,
                      indent=1)


def predict(results, trainers):
    """Adds predicted_s (T_comp + predicted exchange) and the plan's figures to every result of a
    model whose plan and a compute configuration ran (to nothing else: a diagnostic run of other
    configurations measures only)."""
    for r in results:
        ran = {x["config"] for x in results if x["model"] == r["model"]}
        if r["config"] in COMPUTE_CONFIGS or "plan" not in ran or not ran & set(COMPUTE_CONFIGS):
            continue
        exchange = trainers[r["model"], r["config"]].exchange
        if r["config"] == "per_tensor":  # planning="off" made no calibration: price it with the plan's figures
            calibrated = trainers[r["model"], "plan"].exchange.plan.cluster
            tensors = [(b.positions[0], exchange.plan.names[b.positions[0]], b.elements) for b in exchange.plan.buckets]
            plan = planning.per_tensor_plan(tensors, exchange.compressor, calibrated)
            r["predicted_exchange_s"] = planning.predicted_exchange_time(plan)
            r["strategies"] = sorted({b.strategy for b in plan.buckets})
            r["buckets"] = len(plan.buckets)
        elif isinstance(exchange, tfcomp.GradientExchange):
            plan = trainers[r["model"], r["config"]].plan
            r["predicted_exchange_s"] = planning.predicted_exchange_time(plan)
            r["strategies"] = sorted({b.strategy for b in plan.buckets})
            r["buckets"] = len(plan.buckets)
        else:  # plain Horovod, priced with the plan configuration's figures, ready times and slowdown
            plan = trainers[r["model"], "plan"].plan
            variables = trainers[r["model"], r["config"]].model.trainable_variables
            if any(plan.ready.values()):
                r["dense_gradients"] = {"elements": [int(v.shape.num_elements()) for v in variables],
                                        "ready": [plan.ready.get(p, 0.0) for p in range(len(variables))]}
                r["predicted_exchange_s"] = cm.horovod_dense_finish(
                    r["dense_gradients"]["elements"], r["dense_gradients"]["ready"], plan.cluster)
            else:  # one fused ring allreduce of every gradient after the backward pass
                r["predicted_exchange_s"] = st.DENSE.time(r["parameters"], tfcomp.NoCompression(), plan.cluster,
                                                          tensors=len(variables)).total
        r["cluster"] = plan.cluster.to_list()
        r["overlap_slowdown"] = plan.cluster.overlap_slowdown
        r["plan"] = plan.record()  # what a replay (research/prediction_replay.py) prices again
        r["measured_exchange_s"] = trainers[r["model"], r["config"]].measured_exchange_s
        r["compute_s"] = compute_time(results, r["model"], plan.cluster)
        # The backward pass after the step's first gradient is in T_comp and in the exchange's time.
        r["overlapped_s"] = max(plan.ready.values(), default=0.0)
        r["predicted_s"] = r["compute_s"] - r["overlapped_s"] + r["predicted_exchange_s"]


def with_fitted_overlap_slowdown(plan, measured_exchange_s):
    """`plan` with the overlap slowdown fitted to its exchange measured ending `measured_exchange_s`
    after the first gradient (`planning.fit_overlap_slowdown`)."""
    slowdown = planning.fit_overlap_slowdown(plan, measured_exchange_s)
    return dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, overlap_slowdown=slowdown))


def compute_time(results, model_name, cluster):
    """T_comp of `model_name`: compute_synced less the modelled time of its one-float allreduce, but
    no less than the plain compute step (a synchronous step computes at least as long as one that
    waits for nobody), or the plain compute step where compute_synced was not run.

    The floor matters: at the end of a step of 17 ms or more, the one-float allreduce added 0 to 2
    ms on 2 emulated hosts (compute_synced less compute, 2026-11-27), while calibration, timing it
    right after a barrier, priced it at 2 to 16 ms; less that, the CNN's T_comp came out 11.2 ms
    against its 18.5 ms compute step."""
    measured = {x["config"]: x["measured_s"] for x in results if x["model"] == model_name}
    if "compute_synced" not in measured:
        return measured["compute"]
    sync = st.DENSE.time(1, tfcomp.NoCompression(), cluster, tensors=1).total
    return max(measured["compute_synced"] - sync, measured.get("compute", 0.0))


if __name__ == "__main__":
    main()
