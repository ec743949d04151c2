"""The plain-PyTorch recorder: five added lines in a hand-written loop, resumed exactly with a stateful loader,
a verdict (never a crash) for a loader without a cursor, compiled models, and checkpoints never overwritten."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from trainledger.journal import read_events, verify
from trainledger.training.checkpoints.state import ResumeRejected
from trainledger.training.recorder import Recorder

PAGE = Path(__file__).resolve().parents[3] / "docs" / "integrations.md"


def _tags(p):
    return [type(e).__struct_config__.tag for e in read_events(p)]


def _setup(seed: int = 0, compiled: bool = False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(xs, xs.sum(dim=1, keepdim=True))
    if compiled:
        model = torch.compile(model, backend="eager")  # the real wrapper (_orig_mod), without a C++ toolchain
    return model, opt, data


def _train(rec: Recorder, model, opt, loader, steps: int, *, crash_at: int | None = None, every: int = 4,
           data_state=None) -> list[str]:
    losses = []
    it = iter(loader)
    for step in range(rec.start, steps):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
        rec.step(step, loss.item())
        if (step + 1) % every == 0:
            rec.checkpoint(step, data_state=None if data_state is None else data_state(step))
        if step == crash_at:
            raise KeyboardInterrupt  # the process dies here
    return losses


def test_the_integrations_page_example_runs(tmp_path, monkeypatch):
    text = PAGE.read_text()
    block = re.search(r"<!-- example:recorder -->\s*```python\n(.*?)```", text, re.S).group(1)
    added = [ln for ln in block.splitlines() if "# +trainledger" in ln]
    assert len(added) <= 5, added
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "home-keys"))  # the user's default key, made here
    from trainledger.journal import load_public_key

    # as a newcomer runs it: no key made beforehand (the Recorder makes the user's default key and names it)
    exec(compile(block, "docs/integrations.md (recorder example)", "exec"), {})  # noqa: S102 - our own docs
    pub = tmp_path / "runs" / "mine" / "trainledger.pub"
    assert pub.read_text() == (tmp_path / "home-keys" / "default.pub").read_text()
    rep = verify(tmp_path / "runs" / "mine" / "journal.jsonl", keys=[load_public_key(pub)], require_closed=True)
    assert rep.kinds["step_observed"] == 20 and rep.kinds["checkpoint_saved"] == 2
    assert not list((tmp_path / "runs").rglob("*.key"))  # the private key is never in the run folder


def test_a_stateful_loader_resumes_exactly(tmp_path, signer):
    from torchdata.stateful_dataloader import StatefulDataLoader

    model, opt, data = _setup()
    whole_loader = StatefulDataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    with Recorder(tmp_path / "whole", signer=signer, model=model, optimizer=opt, data=whole_loader) as rec:
        whole = _train(rec, model, opt, whole_loader, 12)

    run = tmp_path / "run"
    model, opt, data = _setup()
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    with pytest.raises(KeyboardInterrupt), Recorder(run, signer=signer, model=model, optimizer=opt, data=loader) as rec:
        _train(rec, model, opt, loader, 12, crash_at=9)  # checkpoint after step 7, then dies after step 9
    model, opt, data = _setup(seed=5)  # a fresh process: other weights until the restore
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    with Recorder(run, signer=signer, model=model, optimizer=opt, data=loader) as rec:
        assert rec.start == 8
        tail = _train(rec, model, opt, loader, 12)
    assert tail == whole[8:]  # bit for bit, the loader continued where it stopped
    tags = _tags(run / "journal.jsonl")
    assert tags.count("run_resumed") == 1 and tags[-2:] == ["run_closed", "seal"]
    assert tags.count("run_stopped") == 1 and tags.index("run_stopped") < tags.index("run_resumed")  # the crash


def test_the_crash_is_on_record_and_replay_says_the_run_came_back(tmp_path, signer, capsys):
    from trainledger.cli import main

    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(KeyboardInterrupt), Recorder(tmp_path, signer=signer, model=model, optimizer=opt) as rec:
        _train(rec, model, opt, loader, 12, crash_at=5, data_state=lambda s: {"batch": s + 1})
    [stop] = [e for e in read_events(tmp_path / "journal.jsonl") if type(e).__struct_config__.tag == "run_stopped"]
    assert (stop.rule, stop.reason) == ("exception", "KeyboardInterrupt: ")
    with Recorder(tmp_path, signer=signer, model=model, optimizer=opt) as rec:
        _train(rec, model, opt, loader, 12, data_state=lambda s: {"batch": s + 1})
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(tmp_path / "journal.jsonl")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"stopped: exception \(KeyboardInterrupt: \); resumed at seq \d+", out), out


def test_a_plain_dataloader_gets_a_missing_state_verdict_not_a_crash(tmp_path, signer):
    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(KeyboardInterrupt), Recorder(tmp_path, signer=signer, model=model, optimizer=opt,
                                                    data=loader) as rec:
        _train(rec, model, opt, loader, 12, crash_at=5)  # saved at step 3 without a cursor: no crash
    with pytest.raises(ResumeRejected) as e:
        Recorder(tmp_path, signer=signer, model=model, optimizer=opt, data=loader)
    assert e.value.code == "resume-invalid-missing-state" and "sampler" in e.value.missing
    assert "plain DataLoader" in str(e.value)
    assert _tags(tmp_path / "journal.jsonl")[-2] == "resume_rejected"


def test_a_plain_dataloader_with_data_state_resumes(tmp_path, signer):
    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(KeyboardInterrupt), Recorder(tmp_path, signer=signer, model=model, optimizer=opt,
                                                    data=loader) as rec:
        _train(rec, model, opt, loader, 12, crash_at=5, data_state=lambda s: {"epoch": 0, "batch": s + 1})
    rec = Recorder(tmp_path, signer=signer, model=model, optimizer=opt, data=loader)
    assert rec.start == 4 and rec.data_state == {"epoch": 0, "batch": 4}
    rec.close()


def test_a_compiled_model_saves_plain_weights_and_a_resave_never_overwrites(tmp_path, signer):
    model, opt, data = _setup(compiled=True)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(KeyboardInterrupt), Recorder(tmp_path, signer=signer, model=model, optimizer=opt,
                                                    data=loader) as rec:
        _train(rec, model, opt, loader, 12, crash_at=4, data_state=lambda s: {"batch": s + 1})
    saved = torch.load(tmp_path / "checkpoints" / "step-000000003.pt", weights_only=True)["model"]
    assert not any(k.startswith("_orig_mod.") for k in saved)
    plain, opt2, _ = _setup(seed=3)  # restored into the plain module, as a fine-tune or an eval would
    rec = Recorder(tmp_path, signer=signer, model=plain, optimizer=opt2, data=loader)
    assert rec.start == 4 and torch.equal(plain[0].weight, saved["0.weight"])
    again = rec.checkpoint(3, data_state={"batch": 4})  # nanoGPT re-saves right after resuming
    assert again.path == "checkpoints/step-000000003-1.pt"
    rec.close()
    recorded = [e.path for e in read_events(tmp_path / "journal.jsonl")
                if type(e).__struct_config__.tag == "checkpoint_saved"]
    assert recorded == ["checkpoints/step-000000003.pt", "checkpoints/step-000000003-1.pt"]


def test_a_changed_byte_is_refused(tmp_path, signer):
    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(KeyboardInterrupt), Recorder(tmp_path, signer=signer, model=model, optimizer=opt,
                                                    data=loader) as rec:
        _train(rec, model, opt, loader, 12, crash_at=4, data_state=lambda s: {"batch": s + 1})
    f = tmp_path / "checkpoints" / "step-000000003.pt"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 1
    f.write_bytes(bytes(b))
    with pytest.raises(ResumeRejected) as e:
        Recorder(tmp_path, signer=signer, model=model, optimizer=opt, data=loader)
    assert e.value.code == "resume-invalid-digest"


def test_a_checkpoint_your_own_code_writes_is_recorded_and_checked(tmp_path, signer):
    """nanoGPT writes ckpt.pt itself (and over itself): recorded by digest, the overwritten record marked deleted,
    checked before it is loaded; a changed byte refused."""
    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    rec = Recorder(tmp_path, signer=signer, model=model, optimizer=opt, data=loader)
    ckpt = tmp_path / "ckpt.pt"
    for it in (5, 10):
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": it}, ckpt)
        rec.record_checkpoint(ckpt, step=it - 1)
    assert rec.check_checkpoint(ckpt).step == 9
    b = bytearray(ckpt.read_bytes())
    b[len(b) // 2] ^= 1
    ckpt.write_bytes(bytes(b))
    with pytest.raises(ResumeRejected) as e:
        rec.check_checkpoint(ckpt)
    assert e.value.code == "resume-invalid-digest"
    rec.close()
    tags = _tags(tmp_path / "journal.jsonl")
    assert tags.count("checkpoint_saved") == 2 and tags.count("checkpoint_deleted") == 1
    assert tags.count("run_resumed") == 1 and tags.count("resume_rejected") == 1


def test_a_finished_run_is_continued_in_a_new_journal_linked_to_its_head(tmp_path, signer, pubkey):
    from trainledger.journal import read_events

    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with Recorder(tmp_path / "a", signer=signer, model=model, optimizer=opt, data=loader) as rec:
        _train(rec, model, opt, loader, 8, data_state=lambda s: {"batch": s + 1})
    with pytest.raises(Exception, match="continue_from"):
        Recorder(tmp_path / "a", signer=signer, model=model, optimizer=opt, data=loader)
    fresh, opt2, _ = _setup(seed=9)
    rec = Recorder(tmp_path / "b", signer=signer, model=fresh, optimizer=opt2, data=loader, continue_from=tmp_path / "a")
    assert rec.start == 8 and rec.data_state == {"batch": 8}
    assert torch.equal(fresh[0].weight, model[0].weight)
    rec.close()
    head = verify(tmp_path / "a" / "journal.jsonl", keys=[pubkey]).head
    opened = next(iter(read_events(tmp_path / "b" / "journal.jsonl")))
    assert opened.meta["continues"]["head"] == head and opened.meta["continues"]["step"] == 7
    assert verify(tmp_path / "b" / "journal.jsonl", keys=[pubkey], require_closed=True).ok


def test_a_continued_run_carries_its_predecessors_compute_and_the_statement_links_them(tmp_path, signer, pubkey):
    """A Recorder continued from a finished run counts that run's model FLOPs toward its compute thresholds
    (run_configured.carried_flops), names the device it trains on, and the two runs make one statement with no gap."""
    from trainledger.audit import compute_statement
    from trainledger.journal import read_events
    from trainledger.training.health.flops import FlopConfig

    shape = FlopConfig(n_params=161, n_layer=1, n_head=1, head_dim=1, seq_len=1)
    fpt = 6 * 161 + 12  # 6N + 12LHQT
    model, opt, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with Recorder(tmp_path / "a", signer=signer, model=model, optimizer=opt, data=loader, flop_config=shape) as rec:
        for step in range(8):
            rec.step(step, 1.0, tokens=4)
            if step % 4 == 3:
                rec.checkpoint(step)
    fresh, opt2, _ = _setup(seed=9)
    with Recorder(tmp_path / "b", signer=signer, model=fresh, optimizer=opt2, data=loader, flop_config=shape,
                  continue_from=tmp_path / "a", compute_thresholds={"tiny": 8 * 4 * fpt + 1}) as rec:
        for step in range(rec.start, 12):
            rec.step(step, 1.0, tokens=4)
    cfg = [e for e in read_events(tmp_path / "b" / "journal.jsonl") if type(e).__struct_config__.tag == "run_configured"]
    assert cfg[-1].carried_flops == 8 * 4 * fpt and cfg[-1].device_kind == "cpu"
    crossed = [e for e in read_events(tmp_path / "b" / "journal.jsonl")
               if type(e).__struct_config__.tag == "compute_threshold_crossed"]
    assert [(c.name, c.step) for c in crossed] == [("tiny", 8)]  # the first step of the continued run
    st = compute_statement([tmp_path / "a", tmp_path / "b"], [pubkey])
    assert st["findings"] == [] and st["runs"][1]["continues"] == st["runs"][0]["run"]
    assert st["figures"]["model_flops"] == 12 * 4 * fpt
    import json

    from trainledger.journal.errors import IntegrityError
    from trainledger.journal.statements.compute.statement import check_statement

    assert check_statement(json.dumps(st).encode(), [pubkey]).runs == 2
    st["runs"][1]["continues"] = None  # the link dropped: the continued run's proven run_resumed says otherwise
    with pytest.raises(IntegrityError, match="the run it continues"):
        check_statement(json.dumps(st).encode(), [pubkey])
    assert compute_statement([tmp_path / "b"], [pubkey])["findings"][0].endswith("a gap (its compute is missing)")


def test_batched_steps_record_what_one_at_a_time_records_in_the_steps_order(tmp_path, signer, pubkey):
    """``batch``: the steps are queued and handed to the monitor in batches; the journal holds the same steps, in
    the same order among the checkpoints, the monitor reports the same, every anomaly is returned (by the call that
    handed its step over), and a crash hands the queue over before it is recorded."""
    from trainledger.audit import replay

    def run(folder, batch, crash_at=None):
        model, opt, data = _setup()
        found = []
        with Recorder(folder, signer=signer, model=model, optimizer=opt, batch=batch) as rec:
            for step in range(40):
                loss = 1.0 / (step + 1) + (50.0 if step == 25 else 0.0)  # a spike at step 25
                found += rec.step(step, loss, step_time_s=0.01, tokens=64)
                if (step + 1) % 16 == 0:
                    rec.checkpoint(step)
                if step == crash_at:
                    raise KeyboardInterrupt
            report = rec.report()
        return found, report

    one, r1 = run(tmp_path / "one", 1)
    many, r8 = run(tmp_path / "many", 8)
    assert [(a.kind, a.step) for a in many] == [(a.kind, a.step) for a in one] and one
    assert {k: v for k, v in r8.items() if "time" not in k} == {k: v for k, v in r1.items() if "time" not in k}
    def order(p):
        return [(t, getattr(e, "step", None)) for e, t in zip(read_events(p), _tags(p))
                if t in ("step_observed", "checkpoint_saved", "anomaly_detected")]
    assert order(tmp_path / "many" / "journal.jsonl") == order(tmp_path / "one" / "journal.jsonl")
    for d in ("one", "many"):
        assert replay(tmp_path / d / "journal.jsonl", keys=[pubkey]).ok
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "crash", 8, crash_at=20)
    steps = [e.step for e, t in zip(read_events(tmp_path / "crash" / "journal.jsonl"),
                                    _tags(tmp_path / "crash" / "journal.jsonl")) if t == "step_observed"]
    assert steps == list(range(21))  # the queue (steps 16-20) handed over before the crash was recorded
    for bad in (0, -1, 2.5, True):
        with pytest.raises(Exception, match="batch must be"):
            Recorder(tmp_path / "bad", signer=signer, model=torch.nn.Linear(1, 1),
                     optimizer=torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), batch=bad)


def test_the_default_queues_each_step_with_the_journal_and_records_what_batch_1_records(tmp_path, signer, pubkey):
    """By default step() queues the step with the journal, whose drain folds it: the journal holds the same lines
    in the same order as batch=1 (which folds inside the call), a compute threshold's receipt included (sealed
    durably where it falls), every anomaly is returned by some later call, and replay agrees."""
    from trainledger.audit import replay
    from trainledger.training.health.flops import FlopConfig

    shape = FlopConfig(n_params=1000, n_layer=1, n_head=1, head_dim=8, seq_len=8)

    def run(folder, batch):
        model, opt, _ = _setup()
        found = []
        with Recorder(folder, signer=signer, model=model, optimizer=opt, batch=batch, flop_config=shape,
                      peak_flops_per_sec=1e9, compute_thresholds={"small": 6000 * 64 * 30.5}) as rec:
            for step in range(40):
                loss = 1.0 / (step + 1) + (50.0 if step == 25 else 0.0)  # a spike at step 25
                found += rec.step(step, loss, grad_norm=0.5, lr=1e-3, tokens=64, step_time_s=0.01)
                if step == 20:
                    rec.log({"acc": 0.5})
            found += rec.hand_over()
            report = rec.report()
        return found, report

    one, r1 = run(tmp_path / "one", 1)
    queued, rq = run(tmp_path / "queued", None)
    assert [(a.kind, a.step) for a in queued] == [(a.kind, a.step) for a in one] and one
    assert {k: v for k, v in rq.items() if "time" not in k} == {k: v for k, v in r1.items() if "time" not in k}

    def lines(d):
        p = tmp_path / d / "journal.jsonl"
        return [(t, getattr(e, "step", None)) for e, t in zip(read_events(p), _tags(p)) if t not in ("seal",)]
    assert lines("queued") == lines("one")
    assert ("compute_threshold_crossed", None) in [(t, None) for t, _ in lines("queued")]
    p = tmp_path / "queued" / "journal.jsonl"
    tags = _tags(p)
    crossed = tags.index("compute_threshold_crossed")
    assert tags[crossed + 1] == "seal"  # the receipt sealed where it fell (durably), as batch=1 does
    assert replay(p, keys=[pubkey]).ok
