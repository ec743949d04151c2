"""The queue between a framework callback and the monitor: gradient norms queued as their per-tensor parts are
combined at the drain to the norm ``torch.nn.utils.get_total_norm`` gives, whatever the batch mixes; a NaN grad norm
reaches the monitor (and stops the run) as it came."""

from __future__ import annotations

import math

import pytest
import torch

from trainledger.journal import Journal
from trainledger.training.health.batching import StepBuffer
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.integrations.hooks import norm_parts


def _grads(seed: int, shapes=((64, 32), (32,), (8, 8))) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def test_queued_parts_combine_to_the_total_norm_of_each_step():
    buf = StepBuffer(every=100)
    grads = {i: _grads(i) for i in range(5)}
    grads[3] = _grads(3, shapes=((5,), (7, 2)))  # a step with fewer tensors: the batch is combined step by step
    for i, gs in grads.items():
        buf.add(i, torch.tensor(1.0), norm_parts(gs), {"step_time_s": 0.1})
    buf.add(5, 2.0, None, {"step_time_s": 0.1})  # no norm at all stays None
    buf.add(6, 2.0, torch.tensor(3.5), {"step_time_s": 0.1})  # a plain tensor (the framework's own clip norm)
    out = buf.drain()
    assert [s for s, *_ in out] == list(range(7)) and buf.pending == []
    for (step, loss, gn, _), want in zip(out, [float(torch.nn.utils.get_total_norm(grads[i])) for i in range(5)]):
        assert isinstance(gn, float) and gn == pytest.approx(want, rel=1e-6)
    assert out[5][2] is None and out[6][2] == 3.5


def test_the_uniform_batch_takes_the_one_call_path_and_agrees_with_it():
    buf = StepBuffer(every=100)
    for i in range(16):
        buf.add(i, 0.5, norm_parts(_grads(i)), {"step_time_s": 0.1})
    got = [gn for _, _, gn, _ in buf.drain()]
    assert got == pytest.approx([float(torch.nn.utils.get_total_norm(_grads(i))) for i in range(16)], rel=1e-6)


def test_a_nan_grad_norm_reaches_the_monitor_and_stops_the_run(tmp_path, signer):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, background=False)
    mon = TrainingHealthMonitor(journal=j)
    buf = StepBuffer(every=100)
    for i in range(20):
        gs = _grads(i)
        if i == 12:
            gs[1][0] = math.nan
        buf.add(i, torch.tensor(2.0), norm_parts(gs), {"step_time_s": 0.1, "tokens": None, "lr": 1e-3})
    stop = buf.observe(mon, j, frozenset({"nan_grad_norm"}))
    assert stop is not None and stop.rule == "stop_on:nan_grad_norm" and "step 12" in stop.reason
    j.close()
