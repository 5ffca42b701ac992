"""What tfcomp shows its user: the decisions that change what a training step sends.

`show(message, rank)` shows one message of rank 0 of the exchange's process set where a plain
training script sees it: printed to stdout (and flushed) while absl's verbosity is WARNING or more
verbose (the default of a script that is not an absl app, whose INFO logs nobody sees), and logged
at INFO as well (an absl app's log files). `absl.logging.set_verbosity(absl.logging.ERROR)` silences
the printing; other ranks show nothing. tfcomp shows with it, once each: the first plan (one line),
the plan table whenever a plan is installed (the calibration gate's verdict, calibration's plan,
re-plans), the trial's verdict, each plan change (which costs one retrace of the training step),
and a measured exchange that departs from its prediction by more than 2x. Other logs stay absl logs.
"""

from __future__ import annotations

from absl import logging

__all__ = ["show"]


def show(message: str, rank: int) -> None:
    """Shows `message` (str, may span lines) where `rank` (int, this worker's rank in the process
    set) is 0: printed to stdout and flushed while absl's verbosity is at least WARNING (the
    default), and logged at INFO. Nothing on other ranks."""
    if rank != 0:
        return
    logging.info("%s", message)
    if logging.get_verbosity() >= logging.WARNING:
        print(message, flush=True)
