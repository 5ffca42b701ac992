"""tfcomp.report.show: rank 0's decisions printed where a plain script sees them (absl's default
verbosity), silenced by absl's ERROR verbosity, logged at INFO, and nothing on other ranks."""

import pytest
from absl import logging

from tfcomp import report


@pytest.fixture
def verbosity():
    """Restores absl's verbosity after the test."""
    before = logging.get_verbosity()
    yield
    logging.set_verbosity(before)


def _logged_infos(monkeypatch) -> list:
    infos = []
    monkeypatch.setattr(report.logging, "info", lambda fmt, *args: infos.append(fmt % args))
    return infos


def test_shown_on_rank_0_by_default_and_logged_at_info(capsys, monkeypatch, verbosity, rng):
    infos = _logged_infos(monkeypatch)
    capsys.readouterr()  # the rng fixture's seed
    logging.set_verbosity(logging.WARNING)  # a script that is not an absl app
    message = f"tfcomp: plan {rng.integers(1 << 30)}\n  a second line"
    report.show(message, rank=0)
    assert capsys.readouterr().out == message + "\n" and infos == [message]
    logging.set_verbosity(logging.INFO)  # more verbose: shown too
    report.show(message, rank=0)
    assert capsys.readouterr().out == message + "\n" and infos == [message] * 2


def test_silenced_by_absl_error_verbosity_and_on_other_ranks(capsys, monkeypatch, verbosity):
    infos = _logged_infos(monkeypatch)
    logging.set_verbosity(logging.ERROR)
    report.show("tfcomp: silenced", rank=0)
    assert capsys.readouterr().out == "" and infos == ["tfcomp: silenced"]  # still in the INFO log
    logging.set_verbosity(logging.WARNING)
    for rank in (1, 3):
        report.show("tfcomp: not rank 0", rank=rank)
    assert capsys.readouterr().out == "" and infos == ["tfcomp: silenced"]
