"""The exchange's plan: agreement across ranks, calibration, bucket search, digest check.

`Planner.plan(tensors, signature)` runs eagerly, on every rank of the process set at the same
point (the exchange calls it the first time it sees a list of gradients), and returns the
`tfcomp.planning.Plan` every rank will run:

  1. agreement: every rank's digests of the compressor and its settings, the exchange's settings
     and the gradients' signature (order, shapes, dtypes, dense or sparse) are allgathered; any
     difference raises `PlanMismatchError` on every rank, naming the rank and what differs, before
     any calibration or exchange collective that could wait forever for a rank doing otherwise;
  2. calibration (`tfcomp.calibration`, cached; stopped early where even compression's least
     costs cannot make it pay: `tfcomp.planning.compression_could_pay`) and the bucket search
     (`tfcomp.planning`), or one bucket per tensor with planning="off";
  3. the plan's digest compared across ranks (`PlanMismatchError` on every rank if any differs).

`Planner.dense_plan(tensors, signature)` makes the all-dense plan (1 and 3, nothing measured) that an
exchange runs while its calibration waits to run between training steps: `start_calibration`
readies that calibration, `calibrate_some` runs it a few pieces at a time, and later plans use its
figures (`tfcomp.controller.PlanController` decides when).
"""

from __future__ import annotations

import functools
import time

from tfcomp import calibration, planning
from tfcomp.collectives import allgather_integers, broadcast_floats
from tfcomp.cost_model import ClusterModel
from tfcomp.planning import PlanMismatchError, digest

__all__ = ["Planner", "TensorSignature"]


class TensorSignature(tuple):
    """One gradient as the ranks must agree on it: (name, shape, dtype, kind), kind "dense",
    "sparse" (tf.IndexedSlices) or "none" (no gradient)."""

    def describe(self) -> str:
        name, shape, dtype, kind = self
        return f"{name} {list(shape)} {dtype} {kind}"


class Planner:
    """Makes the plan of one exchange (see the module docstring).

    Args:
      compressor: a `tfcomp.Compressor`.
      process_set: the Horovod process set the exchange reduces over.
      settings: the exchange's other settings that every rank must share (op, factors, ...), a
        JSON-serialisable dict.
    """

    def __init__(self, compressor, process_set, settings: dict):
        self.compressor = compressor
        self.process_set = process_set
        self.settings = settings
        self.cluster = None
        self.calibration_seconds = 0.0  # how long calibration took, all of it in this job (0: none)
        self.ready_cached = False  # whether the first plan took the gradients' ready times from the cache
        self._pieces = None  # calibration between steps, while it runs (a calibration.calibration_pieces generator)

    @property
    def calibration_pending(self) -> bool:
        """Whether a calibration started by `start_calibration` has pieces left to run."""
        return self._pieces is not None

    def start_calibration(self, tensors) -> None:
        """Readies the calibration for `tensors` = [(position, name, elements)] in backprop order
        (as `plan` would calibrate) to run a few pieces at a time (`calibrate_some`). Nothing runs
        yet; nothing where it is started already."""
        if self._pieces is None:
            self._pieces = calibration.calibration_pieces(self.compressor, self.process_set,
                                                          max_elements=sum(n for _, _, n in tensors),
                                                          tensor_elements=[n for _, _, n in tensors],
                                                          could_pay=self._could_pay(tensors))

    def calibrate_some(self, seconds: float) -> bool:
        """Runs pieces of the calibration `start_calibration` readied (eagerly, on every rank at the same point: each
        runs collectives) until rank 0 has spent `seconds` in this call (rank 0 decides for every
        rank after each piece: one broadcast) or it is done. Returns True once it is done (its
        figures in `cluster`; True also where nothing is pending)."""
        if self._pieces is None:
            return True
        start = time.perf_counter()
        try:
            while True:
                next(self._pieces)
                spent = time.perf_counter() - start >= seconds
                if broadcast_floats([float(spent)], self.process_set, "tfcomp_calibration_piece")[0] == 1.0:
                    return False
        except StopIteration as done:
            self.cluster, self._pieces = done.value, None
            return True
        finally:
            self.calibration_seconds += time.perf_counter() - start

    def _finish_calibration(self) -> None:
        """Runs what is left of a calibration between steps at once."""
        self.calibrate_some(float("inf"))

    def plan(self, tensors, signature, ready_seconds=None, step=None) -> planning.Plan:
        """The plan for `tensors` = [(position, name, elements)] in backprop order (the gradients
        that may be compressed), checked equal on all ranks. `signature`: a `TensorSignature` per
        gradient of the exchange's list, in its order. `ready_seconds`: when each of `tensors` is
        ready (`tfcomp.planning.make_plan`), the same on every rank; None: those an earlier job of
        the same model measured on these hosts (`calibration.cached_ready_times`) for the first
        plan, else all after the backward pass. `step`: (the measured training step in seconds, the
        margin a compressing plan must gain of it: `tfcomp.planning.make_plan`'s `step_seconds` and
        `margin`), or None (the predicted all-dense step and `planning.COMPRESSION_MARGIN`). A
        calibration between steps still pending is finished first, at once."""
        workers = self.process_set.size()
        if workers > 1:
            self._check_agreement(signature)
        self._finish_calibration()
        if self.compressor.planning == "off" or not tensors:
            plan = planning.per_tensor_plan(tensors, self.compressor, ClusterModel.unpriced(workers))
        else:
            if self.cluster is None:
                self.recalibrate(tensors)
                if ready_seconds is None and workers > 1:
                    ready_seconds = calibration.cached_ready_times(self.process_set, [n for _, _, n in tensors])
                    self.ready_cached = ready_seconds is not None
            step_seconds, margin = step if step is not None else (None, planning.COMPRESSION_MARGIN)
            plan = planning.make_plan(tensors, self.compressor, self.cluster, ready_seconds=ready_seconds,
                                      step_seconds=step_seconds, margin=margin)
        if workers > 1:
            self._check_plan(plan)
        return plan

    def dense_plan(self, tensors, signature) -> planning.Plan:
        """Every one of `tensors` sent dense (`tfcomp.planning.dense_plan`, unpriced figures), after
        the ranks' agreement on `signature`, its digest checked across ranks (as `plan`); nothing
        measured. Eagerly, on every rank at the same point."""
        workers = self.process_set.size()
        if workers > 1:
            self._check_agreement(signature)
        plan = planning.dense_plan(tensors, self.compressor, ClusterModel.unpriced(workers))
        if workers > 1:
            self._check_plan(plan)
        return plan

    def keep_ready_times(self, tensors, ready_seconds) -> None:
        """Caches `ready_seconds` (measured in training, one per tensor of `tensors`, the same on
        every rank) for the first plan of a later job of the same model (`calibration`'s cache)."""
        calibration.store_ready_times(self.process_set, [n for _, _, n in tensors], ready_seconds)

    def dense_verdict(self, tensors):
        """The exposed share of the step (E / step) at which an earlier job of this model and
        compressor on these hosts found compressing not paying (`calibration.cached_dense_verdict`),
        or None; every rank at the same point."""
        return calibration.cached_dense_verdict(self.process_set, self.compressor, [n for _, _, n in tensors])

    def keep_dense_verdict(self, tensors, potential_gain: float) -> None:
        """Caches that compressing does not pay for `tensors` here, at `potential_gain` (E / step)."""
        calibration.store_dense_verdict(self.process_set, self.compressor, [n for _, _, n in tensors], potential_gain)

    def recalibrate(self, tensors):
        """Calibrates the cluster for `tensors` (as in `plan`), on every rank at the same point;
        the figures every later plan is made from. Returns the `ClusterModel`."""
        start = time.perf_counter()
        self.cluster = calibration.calibrate(self.compressor, self.process_set,
                                             max_elements=sum(n for _, _, n in tensors),
                                             tensor_elements=[n for _, _, n in tensors],
                                             could_pay=self._could_pay(tensors))
        self.calibration_seconds += time.perf_counter() - start
        return self.cluster

    def _could_pay(self, tensors):
        """The rule by which calibration stops early for `tensors` (`planning.compression_could_pay`):
        given the cluster with compression at its least costs, whether compressing could pay on it."""
        return functools.partial(planning.compression_could_pay, list(tensors), self.compressor)

    def _check_agreement(self, signature) -> None:
        """Raises PlanMismatchError on every rank if the ranks' compressors, settings or gradient
        signatures differ (two eager allgathers of integers; a third, of per-tensor digests, only
        when the signatures differ)."""
        parts = {
            "compressor": repr(self.compressor),
            "exchange settings": self.settings,
            "number of gradients": len(signature),
            "gradients": [list(s[1:]) for s in signature],
        }
        mine = [digest(value) for value in parts.values()] + [len(signature)]
        gathered = allgather_integers(mine, self.process_set, "tfcomp_agreement")
        columns = {name: column for column, name in enumerate(parts) if len(set(gathered[:, column])) > 1}
        differing = list(columns)
        if not differing:
            return
        rank = self.process_set.rank()
        details = [f"rank {rank} has {name} {parts[name]!r}" for name in differing if name != "gradients"]
        if "gradients" in differing:
            details.append(self._first_differing_gradient(signature, int(max(gathered[:, -1]))))
        mismatched = sorted({r for column in columns.values() for r in range(len(gathered))
                             if gathered[r, column] != gathered[0, column]})
        raise PlanMismatchError(
            f"tfcomp: the ranks' exchanges differ in {', '.join(differing)} (ranks that differ from rank 0: "
            f"{mismatched}); every rank must train the same model with the same compressor and settings. "
            + "; ".join(details))

    def _first_differing_gradient(self, signature, longest: int) -> str:
        """Which gradient first differs between the ranks, as this rank sees it (one more allgather)."""
        padded = [digest(list(s[1:])) for s in signature] + [-1] * (longest - len(signature))
        gathered = allgather_integers(padded, self.process_set, "tfcomp_agreement_gradients")
        for position in range(longest):
            if len(set(gathered[:, position])) > 1:
                mine = signature[position].describe() if position < len(signature) else "no gradient"
                return f"gradient {position} differs: on rank {self.process_set.rank()} it is {mine}"
        return "the gradients differ"

    def _check_plan(self, plan: planning.Plan) -> None:
        """Raises PlanMismatchError on every rank if any rank's plan digest differs."""
        digests = [int(d) for d in allgather_integers([plan.digest()], self.process_set, "tfcomp_plan_digest")[:, 0]]
        if len(set(digests)) > 1:
            raise PlanMismatchError(
                "tfcomp: the ranks made different exchange plans (digests by rank: "
                f"{', '.join(f'{r}: {d:x}' for r, d in enumerate(digests))}). Every rank must see the same "
                "gradients (names, shapes, order) and the same compressor settings; this rank's plan:\n" + plan.table())
