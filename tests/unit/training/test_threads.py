"""The project's own tiny-model training runs in one intra-op thread (TRAINLEDGER_THREADS to change it), and the
caller's thread count is put back after it."""

from __future__ import annotations

import pytest
import torch

from trainledger.journal.errors import UsageError
from trainledger.training.reference.threads import in_own_threads, own_threads, thread_count


def test_one_thread_inside_and_the_callers_count_after(monkeypatch):
    monkeypatch.delenv("TRAINLEDGER_THREADS", raising=False)
    before = torch.get_num_threads()
    seen = []

    @in_own_threads
    def train():
        seen.append(torch.get_num_threads())
        raise RuntimeError("a failing run")

    with pytest.raises(RuntimeError):
        train()
    assert seen == [1] and torch.get_num_threads() == before
    monkeypatch.setenv("TRAINLEDGER_THREADS", "2")
    with own_threads() as n:
        assert n == 2 == torch.get_num_threads()
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("TRAINLEDGER_THREADS", bad)
        with pytest.raises(UsageError, match="TRAINLEDGER_THREADS"):
            thread_count()


def test_the_ladder_trains_its_rungs_in_one_thread(monkeypatch):
    from trainledger.ladder import runner
    from trainledger.ladder.presets import tiny

    monkeypatch.delenv("TRAINLEDGER_THREADS", raising=False)
    seen, lines = [], []
    real = runner._train_rung

    def spy(*a, **kw):
        seen.append(torch.get_num_threads())
        return real(*a, **kw)

    monkeypatch.setattr(runner, "_train_rung", spy)
    rungs = [r for r in tiny()][:1]
    runner.run_pilot_ladder(rungs, progress=lines.append)
    assert seen == [1]
    assert lines[0].startswith("rung 1/1 rung_i_shakeout: 30 steps") and "GO in" in lines[-1]
