"""Seals signed off the appending path (format 1.7): with a key that is slow or stops answering, ``append`` never
waits for a signature, the journal records each late signature (``seal_signed``, how late, how many tries), a run
that asks to fail closed does so after N seconds without one, a crash with a seal waiting loses nothing signed, and
the verifier holds every late signature to the seal it names, across the ranges of a parallel verification."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from slow_token import Token, journal_signed_late, kinds, settled, wait_for

from trainledger.journal import Journal, Signer, StepObserved, verify
from trainledger.journal.errors import JournalIOError, SealInvalid, UnsealedEvents
from trainledger.journal.writer import Fault


def test_a_token_that_stops_answering_delays_seals_and_never_an_append(tmp_path):
    key = Token()
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=key, seal_every=50, seal_interval_s=0.05)
    for i in range(200):
        j.append(StepObserved(step=i, loss=1.0))
    key.up.clear()  # pulled out
    for i in range(200, 5200):
        j.append(StepObserved(step=i, loss=1.0))
        if i % 500 == 0:
            time.sleep(0.02)  # seals come due, by count and by time
    # 5,000 appends returned with the key still out: one that waited for it would never have returned
    assert not key.up.is_set()
    j.flush()
    lines = kinds(p)
    pending = [x for x in lines if x["kind"] == "seal" and x.get("sig") is None]
    assert pending and len([x for x in lines if x["seq"] > pending[-1]["seq"] and x["kind"] == "seal"]) == 0
    rep = verify(p, keys=[key.public], allow_unsealed=True)  # the signed prefix ends before the pending seal
    assert rep.ok and rep.unsealed_events >= 5000 - 200
    key.up.set()  # back
    wait_for(lambda: any(x["kind"] == "seal_signed" and x["seal_seq"] == pending[-1]["seq"] for x in kinds(p)))
    j.close()
    late = [x for x in kinds(p) if x["kind"] == "seal_signed"]
    assert max(x.get("waited_ms", 0) for x in late) >= 20
    rep = verify(p, keys=[key.public], require_closed=True)
    assert rep.ok and rep.events == len(kinds(p)) and rep.kinds["seal_signed"] == len(late)


def test_fail_closed_after_n_seconds_without_a_signature_and_go_on_when_it_comes(tmp_path):
    key = Token()
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=key, seal_every=20, seal_interval_s=0.05, fail_closed_after_s=0.3)
    key.fail = True  # every try fails at once: retried with a growing pause
    t0 = time.monotonic()
    with pytest.raises(JournalIOError, match=r"no signature from key [0-9a-f]{16} for 0\.[3-9].*CKR_DEVICE_REMOVED.*"
                                             "fails closed"):
        for i in range(10**6):
            j.append(StepObserved(step=i, loss=1.0))
            time.sleep(0.001)
    assert 0.3 <= time.monotonic() - t0 < 60  # not before 0.3 s; the upper bound only catches a hang
    with pytest.raises(JournalIOError, match="fails closed"):  # it stays closed while there is no signature
        j.append(StepObserved(step=-1, loss=1.0))
    assert j.fault is Fault.NO_SIGNATURE  # the state, not a message to parse
    key.fail = False
    wait_for(lambda: settled(j))
    time.sleep(0.1)
    j.append(StepObserved(step=-2, loss=1.0))  # the key answered: the run goes on
    assert j.fault is None
    j.close()
    late = [x for x in kinds(p) if x["kind"] == "seal_signed"]
    assert late[0]["attempts"] > 1 and "CKR_DEVICE_REMOVED" in late[0]["error"]
    assert verify(p, keys=[key.public], require_closed=True).ok


def test_a_crash_with_a_seal_waiting_keeps_everything_signed_before_it(tmp_path):
    key = Token()
    p = tmp_path / "j.jsonl"
    j = journal_signed_late(p, key, 250, 100, settle_each=False)
    j.append(StepObserved(step=250, loss=1.0))  # records the signature of the seal after step 99, and so on
    key.up.clear()
    for i in range(251, 420):
        j.append(StepObserved(step=i, loss=1.0))
    j.flush()
    crashed = tmp_path / "crashed.jsonl"
    shutil.copyfile(p, crashed)  # the machine dies here: a seal is waiting for its signature
    before = verify(crashed, keys=[key.public], allow_unsealed=True)
    assert before.ok and before.last_sealed_seq is not None
    with pytest.raises(UnsealedEvents):
        verify(crashed, keys=[key.public])
    key.up.set()
    j2 = Journal.open_append(crashed, signer=key, background=False)
    j2.close()
    after = verify(crashed, keys=[key.public], require_closed=True)
    assert after.ok and after.kinds["tail_repaired"] == 1
    steps = [x["step"] for x in kinds(crashed) if x["kind"] == "step_observed"]
    assert steps == list(range(len(steps))) and len(steps) >= 100  # the signed steps kept, in order
    sidecar = list(tmp_path.glob("crashed.jsonl.unsealed-*"))
    assert len(sidecar) == 1  # what no signature covered, moved aside, never deleted
    j.close()


def test_a_late_signature_is_held_to_the_seal_it_names_across_parallel_ranges(tmp_path, monkeypatch):
    from journal_tools import dump, read_lines, rechain, write_lines
    import msgspec

    import importlib

    from trainledger.journal import RunResumed

    verify_module = importlib.import_module("trainledger.journal.verify")  # the module (the package exports verify())

    key = Token(delay=0.004)  # a signature comes back thousands of lines after its seal
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=key, seal_every=2000, background=False)
    pad = "y" * 120
    for i in range(150_000):
        j.append(RunResumed(reason=pad))
    j.close()
    assert p.stat().st_size > 24 << 20
    carried = []
    real = verify_module._carry_late_signatures

    def spy(results):
        real(results)
        carried.extend(r for r in results if r.carry_resolution is not None)
    monkeypatch.setattr(verify_module, "_carry_late_signatures", spy)
    one = verify(p, keys=[key.public], workers=1, require_closed=True)
    many = verify(p, keys=[key.public], workers=4, require_closed=True)
    assert carried  # some signature came in a later range than its seal (the merge joined them)
    assert one.ok and many.ok and one.kinds["seal_signed"] > 10
    assert (one.seals, one.sealed_bytes, one.last_tree_root) == (many.seals, many.sealed_bytes, many.last_tree_root)
    # a journal that ends with a late signature (a crash after it): its signed prefix ends at the seal it names,
    # wherever the ranges fall
    lines = read_lines(p)
    last = max(i for i, ln in enumerate(lines) if b'"kind":"seal_signed"' in ln)
    cut = tmp_path / "cut.jsonl"
    write_lines(cut, lines[:last + 1])
    carried.clear()
    one = verify(cut, keys=[key.public], workers=1, allow_unsealed=True)
    many = verify(cut, keys=[key.public], workers=4, allow_unsealed=True)
    named = json.loads(lines[last])["seal_seq"]
    assert one.last_sealed_seq == many.last_sealed_seq == named - 1
    assert (one.sealed_bytes, one.seal_line_hash, one.sealed_tree.root()) == \
        (many.sealed_bytes, many.seal_line_hash, many.sealed_tree.root())
    assert one.sealed_bytes == sum(len(ln) + 1 for ln in lines[:named + 1])
    # a late signature moved to name another seal; one with no seal waiting; one signed by another key
    small = tmp_path / "s.jsonl"
    j = Journal.create(small, signer=key, seal_every=10, background=False)
    for i in range(35):
        j.append(StepObserved(step=i, loss=1.0))
        if i % 10 == 9:
            wait_for(lambda: settled(j))
    j.close()
    lines = read_lines(small)
    at = [i for i, ln in enumerate(lines) if b'"kind":"seal_signed"' in ln]
    ss = msgspec.json.decode(lines[at[0]])  # the first late signature again, where the second belongs
    with pytest.raises(SealInvalid, match=f"seal_signed at seq {at[1]} names seal {ss['seal_seq']}, not the seal "
                                          "waiting"):
        verify_lines(small, rechain(lines[:at[1]] + [dump(ss)] + lines[at[1] + 1:]), key)
    dup = rechain(lines[:at[1] + 1] + [lines[at[1]]] + lines[at[1] + 1:])
    with pytest.raises(SealInvalid, match="no seal is waiting for a signature"):
        verify_lines(small, dup, key)
    other = Signer.generate()
    ss = msgspec.json.decode(lines[at[1]])
    import base64

    from trainledger.journal.chain import seal_checkpoint

    ss["sig"] = base64.b64encode(other.sign(seal_checkpoint(
        json.loads(lines[0])["run_id"], ss["tree_size"], bytes.fromhex(ss["tree_root"]), ss["sealed_seq"],
        bytes.fromhex(ss["sealed_hash"])).encode())).decode()
    with pytest.raises(SealInvalid, match=f"seal_signed at seq {at[1]}: the signature of seal .* does not verify"):
        verify_lines(small, rechain(lines[:at[1]] + [dump(ss)] + lines[at[1] + 1:]), key)
    assert write_lines  # the helpers' writer: verify_lines uses it


def verify_lines(path, lines, key):
    from journal_tools import write_lines

    q = path.with_name("tampered.jsonl")
    write_lines(q, lines)
    return verify(q, keys=[key.public])


def test_close_with_a_key_that_never_answers_fails_in_one_line_and_can_be_retried(tmp_path):
    key = Token()
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=key, seal_every=10)
    j._sealer.sign_wait_s = 0.3
    for i in range(25):
        j.append(StepObserved(step=i, loss=1.0))
    key.up.clear()
    with pytest.raises(JournalIOError, match=r"key [0-9a-f]{16} gave no signature in 0.3 s"):
        j.close()
    key.up.set()
    j._sealer.sign_wait_s = 30
    j.close()  # the retry signs the closing seal
    assert verify(p, keys=[key.public], require_closed=True).ok


def test_a_key_file_signs_in_place_and_writes_the_format_it_always_did(tmp_path):
    s = Signer.generate()
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=s, seal_every=10, background=False) as j:
        for i in range(30):
            j.append(StepObserved(step=i, loss=1.0))
    assert all(x.get("sig") for x in kinds(p) if x["kind"] == "seal")
    assert not any(x["kind"] == "seal_signed" for x in kinds(p))


def test_a_live_journal_signed_late_proves_against_its_latest_signature(tmp_path):
    """A bundle of a live run whose last seal still waits for its signature is made against the latest seal that
    has one (the signature from its seal_signed line), and verifies offline; a seal never signed is refused."""
    from trainledger.journal import proofs as T

    key = Token()
    p = tmp_path / "j.jsonl"
    j = journal_signed_late(p, key, 250, 100)
    key.up.clear()
    for i in range(250, 330):
        j.append(StepObserved(step=i, loss=1.0))
    j.flush()
    lines = kinds(p)
    signed = max(x["seal_seq"] for x in lines if x["kind"] == "seal_signed")
    waiting = [x["seq"] for x in lines if x["kind"] == "seal" and x.get("sig") is None and x["seq"] > signed]
    assert waiting  # the latest seal is waiting for its signature
    res = T.prove(p, [3, signed - 1], keys=[key.public])
    r = T.verify_bundle(json.dumps(res.bundle).encode(), [key.public])
    assert r.tree_size == signed and [e.seq for e in r.events] == [3, signed - 1]
    with pytest.raises(Exception, match="never signed"):
        T.prove(p, [3], keys=[key.public], tree_size=waiting[-1])
    key.up.set()
    j.close()


def test_the_recorder_fails_closed_when_asked(tmp_path):
    torch = pytest.importorskip("torch")
    from trainledger.training import Recorder

    key = Token()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "run", signer=key, model=model, optimizer=opt, fail_closed_after_s=0.3)
    assert rec.journal._sealer.in_background  # a key that is not a plain in-process one signs in the background
    key.up.clear()
    t0 = time.monotonic()
    with pytest.raises(JournalIOError, match="no signature from key .*the run fails closed"):
        for step in range(10**6):
            rec.step(step, 1.0 / (step + 1), tokens=8)
            time.sleep(0.002)
    assert time.monotonic() - t0 < 60  # a bound for a hang, not a timing
    key.up.set()
    wait_for(lambda: settled(rec.journal))
    time.sleep(0.05)
    rec.step(step + 1, 0.5, tokens=8)  # the key answered: the run goes on
    rec.close()
    assert verify(tmp_path / "run" / "journal.jsonl", keys=[key.public], require_closed=True).ok


def test_the_compute_total_counts_every_step_when_the_key_signs_late(tmp_path):
    """record_compute reads the journal back as signed: it waits for the signature of the seal it asks for, so a
    key that signs in the background (a token) costs the total no step, and replay agrees with it."""
    from trainledger.audit import replay
    from trainledger.training.health.mfu import record_compute

    key = Token(delay=0.02)  # each signature comes back after some appends
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=key, seal_every=50)
    for i in range(777):
        j.append(StepObserved(step=i, loss=1.0, tokens=8))
    ev = record_compute(j)
    j.close()
    assert ev.steps == 777 and ev.tokens == 777 * 8
    rec = replay(p, keys=[key.public])
    assert rec.ok and rec.differences == []


def test_no_checkpoint_is_deleted_before_its_replacement_is_signed(tmp_path):
    """keep_last with a key that signs late: when an old checkpoint is deleted, the record of the new one is signed
    already, so a crash right then can never leave only deleted checkpoints signed."""
    torch = pytest.importorskip("torch")
    from trainledger.journal import read_signed_events
    from trainledger.training import Recorder
    from trainledger.training.checkpoints.state import CheckpointSaved

    key = Token(delay=0.05)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "run", signer=key, model=model, optimizer=opt, keep_last=1)
    for step in range(10):
        rec.step(step, 1.0 / (step + 1))
        if step in (4, 9):
            rec.checkpoint(step)
    signed = [e.step for e in read_signed_events(rec.journal.path, [key.public]) if isinstance(e, CheckpointSaved)]
    assert signed[-1] == 9 and not (tmp_path / "run" / "checkpoints" / "step-000000004.pt").exists()
    rec.close()
