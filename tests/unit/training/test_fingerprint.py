"""The batch fingerprint and data_divergence: a step run again after a resume on another batch than the first
time's is flagged, live and by replay; the same batches are not; a rewind's deliberately skipped data is not."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainledger.cli import main
from trainledger.journal import read_events
from trainledger.journal.events import RunResumed, StepObserved
from trainledger.training.kinds import DataWindowSkipped
from trainledger.training import Recorder, batch_fingerprint
from trainledger.training.health.detectors import HealthProjection, RunConfigured


def test_the_fingerprint_tells_batches_apart_and_is_the_same_for_the_same_batch():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    fp = batch_fingerprint(x, y)
    assert fp.dtype == torch.float64 and fp.dim() == 0
    assert fp.item() == batch_fingerprint(x.clone(), y.clone()).item()
    others = [batch_fingerprint(x[torch.randperm(16, generator=g)], y), batch_fingerprint(x + 1e-3, y),
              batch_fingerprint(x, (y + 1) % 10), batch_fingerprint(torch.randn(16, 8, generator=g), y)]
    assert all(o.item() != fp.item() for o in others)
    with pytest.raises(TypeError):
        batch_fingerprint([1, 2])


def _fold(events):
    p = HealthProjection(RunConfigured(loss_scale="log"))
    found = []
    for ev in events:
        found += [a for a in p.apply(ev) if a.anomaly == "data_divergence"]
    return found


def test_a_redone_step_on_another_batch_is_a_data_divergence_and_a_rewind_is_not():
    first = [StepObserved(step=i, loss=1.0, batch_fingerprint=float(i)) for i in range(10)]
    redo = [StepObserved(step=i, loss=1.0, batch_fingerprint=float(i) + (0.5 if i == 7 else 0.0)) for i in range(5, 10)]
    [a] = _fold(first + [RunResumed(reason="checkpoint", from_step=4)] + redo)
    assert (a.step, a.value, a.baseline_median) == (7, 7.5, 7.0)
    assert _fold(first + [RunResumed(reason="checkpoint", from_step=4)] + redo[:2] + redo[3:]) == []
    skipped = [RunResumed(reason="checkpoint", from_step=4), DataWindowSkipped(start_batch=5, end_batch=8)]
    assert _fold(first + skipped + redo) == []  # a rewind skips data on purpose


def _run(run, signer, *, crash_at=None, skip=lambda rec: rec.data_state["batch"]):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(64, 4, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=4)
    with Recorder(run, signer=signer, model=model, optimizer=opt) as rec:
        it = iter(loader) if rec.start == 0 else itertools.islice(iter(loader), skip(rec), None)
        for step in range(rec.start, 12):
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_f, fp = torch.stack([loss.detach().double(), batch_fingerprint(x, y)]).tolist()
            rec.step(step, loss_f, batch_fingerprint=fp)
            if (step + 1) % 4 == 0:
                rec.checkpoint(step, data_state={"batch": step + 1})
            if step == crash_at:
                raise KeyboardInterrupt


@pytest.mark.parametrize("skip, flagged", [(lambda rec: rec.data_state["batch"], []),
                                           (lambda rec: rec.data_state["batch"] - 1, [8])])
def test_a_plain_dataloader_skipped_by_hand_is_held_to_what_it_trained_first(tmp_path, signer, skip, flagged, capsys):
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _run(run, signer, crash_at=9)  # checkpoint after step 7; steps 8 and 9 on record, then the crash
    _run(run, signer, skip=skip)  # the resume: right, or one batch short
    found = [e.step for e in read_events(run / "journal.jsonl")
             if type(e).__struct_config__.tag == "anomaly_detected" and e.anomaly == "data_divergence"]
    assert found == flagged  # one anomaly a resume: the redone steps that go on diverging are its episode
    ended = [(e.step, e.series, e.last_step, e.steps, e.closed_by, e.ended_at) for e in read_events(run / "journal.jsonl")
             if type(e).__struct_config__.tag == "anomaly_ended"]
    # step 10 was never done before: the episode closed there
    assert ended == ([(8, "data", 9, 2, "calm", 10)] if flagged else [])
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(run / "journal.jsonl")]) == 0  # replay recomputes them
    out = capsys.readouterr().out
    assert ("anomaly data_divergence: 1 at step 8" in out) == bool(flagged), out


def test_a_doctored_data_divergence_in_a_signed_journal_is_named_by_replay(tmp_path, signer):
    """The verdict rests on the fingerprints: hidden, or forged where the batches matched, with the run's own key
    re-signing the lie, replay recomputes it from the steps and names the difference."""
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    from trainledger.audit import replay

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _run(run, signer, crash_at=9)
    _run(run, signer, skip=lambda rec: rec.data_state["batch"] - 1)  # flagged at step 8, its episode to step 9
    lines = read_lines(run / "journal.jsonl")
    flagged = [i for i, ln in enumerate(lines) if b'"data_divergence"' in ln and b'"anomaly_detected"' in ln]
    assert len(flagged) == 1
    hidden = tmp_path / "hidden.jsonl"
    write_lines(hidden, rechain([ln for i, ln in enumerate(lines) if i != flagged[0]], resign=signer))
    forged = tmp_path / "forged.jsonl"
    obj = parse(lines[flagged[0]])
    obj["step"] = 3  # a step whose batch was never redone
    write_lines(forged, rechain(lines[:flagged[0]] + [dump(obj)] + lines[flagged[0] + 1:], resign=signer))
    for doctored in (hidden, forged):
        rec = replay(doctored, keys=[signer.public])
        assert not rec.ok and any(d["kind"] == "anomaly_detected" for d in rec.differences), rec.differences
    assert replay(run / "journal.jsonl", keys=[signer.public]).ok
