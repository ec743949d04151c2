"""One test per attack on a journal, each asserting the specific error it must raise."""

from __future__ import annotations

import base64

import pytest
from journal_tools import dump, kinds, parse, read_lines, rechain, seal_signed_message, write_lines

from trainledger.journal import (
    ChainBroken,
    HeadMismatch,
    Journal,
    NonCanonicalRecord,
    NotClosed,
    RunMismatch,
    SealInvalid,
    SequenceError,
    Signer,
    UnsealedEvents,
    UnsignedJournal,
    UntrustedKey,
    verify,
)


def _verify(path, pubkey, **kw):
    return verify(path, keys=[pubkey], **kw)


def _step_index(lines, nth=5):
    return [i for i, k in enumerate(kinds(lines)) if k == "step_observed"][nth]


def test_intact_journal_verifies(make_journal, pubkey):
    r = _verify(make_journal(50), pubkey, require_closed=True)
    # run_opened + its seal, 50 steps + 5 seals (every 10), run_closed + its seal
    assert r.ok and r.tail == "closed" and r.events == 1 + 1 + 50 + 5 + 1 + 1
    assert r.kinds == {"run_opened": 1, "seal": 7, "step_observed": 50, "run_closed": 1}
    assert r.unsealed_events == 0 and r.trust == "pinned"


def test_byte_flip(make_journal, pubkey):
    path = make_journal(50)
    data = bytearray(path.read_bytes())
    pos = data.index(b'"loss":2.9')  # step 10's loss
    data[pos + len('"loss":2.9')] ^= 0x01  # a digit becomes another digit
    path.write_bytes(bytes(data))
    with pytest.raises(ChainBroken) as ei:
        _verify(path, pubkey)
    assert ei.value.seq is not None and ei.value.report.first_bad_seq == ei.value.seq


def test_line_deletion(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    del lines[i]
    write_lines(path, lines)
    with pytest.raises(SequenceError, match="deleted") as ei:
        _verify(path, pubkey)
    assert ei.value.seq == i


def test_line_deletion_rechained(make_journal, pubkey):
    """Deleting a line and recomputing the whole chain still breaks the next seal."""
    path = make_journal(50)
    lines = read_lines(path)
    del lines[_step_index(lines)]
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid, match="signature does not verify"):
        _verify(path, pubkey)


def test_line_insertion(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    forged = parse(lines[i])
    forged["loss"] = 0.001
    lines.insert(i + 1, dump(forged))
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid, match="signature does not verify"):
        _verify(path, pubkey)


def test_line_duplication(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    lines.insert(i + 1, lines[i])
    write_lines(path, lines)
    with pytest.raises(SequenceError, match="repeated or out of order") as ei:
        _verify(path, pubkey)
    assert ei.value.seq == i + 1


def test_line_swap(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    write_lines(path, lines)
    with pytest.raises(SequenceError) as ei:
        _verify(path, pubkey)
    assert ei.value.seq == i


def test_line_swap_rechained(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid):
        _verify(path, pubkey)


def test_splice_from_other_run(make_journal, pubkey):
    """Run B's sealed lines, signed by the same key, spliced into run A, re-chained."""
    a = make_journal(30, run_id="run-a")
    b = make_journal(30, run_id="run-b")
    la, lb = read_lines(a), read_lines(b)
    # A's prefix up to (not including) its close, then B's body including B's real seals.
    cut_a = kinds(la).index("run_closed")
    spliced = la[:cut_a] + [x for x in lb[1:] if parse(x)["kind"] != "run_closed"][:20]
    path = a.with_name("spliced.jsonl")
    write_lines(path, rechain(spliced))
    with pytest.raises(SealInvalid, match="signature does not verify"):
        _verify(path, pubkey)


def test_splice_other_run_opening(make_journal, pubkey):
    """A second run_opened in the middle of a journal is another run's events."""
    a = make_journal(20, run_id="run-a")
    b = make_journal(5, run_id="run-b")
    la, lb = read_lines(a), read_lines(b)
    i = _step_index(la, 3)
    spliced = la[:i] + [lb[0]] + la[i:]
    write_lines(a, rechain(spliced))
    with pytest.raises(RunMismatch, match="second run"):
        _verify(a, pubkey)


def test_resigned_with_another_key(make_journal, pubkey, tmp_path):
    """The attacker rewrites the journal and re-signs every seal with their own key."""
    path = make_journal(40)
    lines = read_lines(path)
    lines[_step_index(lines)] = dump({**parse(lines[_step_index(lines)]), "loss": 0.0})
    evil = Signer.generate()
    opened = parse(lines[0])
    opened["key_id"], opened["public_key"] = evil.key_id, evil.public.b64
    lines[0] = dump(opened)

    write_lines(path, rechain(lines, resign=evil))
    # Internally consistent: it verifies against its own embedded key...
    assert verify(path, trust_embedded=True).trust == "embedded"
    # ...but not against the key we pinned.
    with pytest.raises(UntrustedKey, match="not pinned"):
        _verify(path, pubkey)


def test_truncation_against_expect_head(make_journal, pubkey):
    path = make_journal(50)
    published = _verify(path, pubkey).head
    lines = read_lines(path)
    write_lines(path, lines[:-12])
    truncated = _verify(path, pubkey, allow_unsealed=True)  # a chain alone cannot see truncation...
    assert truncated.tail == "open" and truncated.unsealed_events > 0
    with pytest.raises(HeadMismatch, match="truncated"):  # ...a published head can.
        _verify(path, pubkey, expect_head=published)


def test_rewritten_tail_against_expect_head(make_journal, pubkey):
    path = make_journal(50, close=False)
    lines = read_lines(path)
    head = _verify(path, pubkey).head
    seq = int(head.split(":")[0])
    lines[seq] = dump({**parse(lines[seq]), "loss": 0.5})
    write_lines(path, rechain(lines[:seq + 1]))
    with pytest.raises(HeadMismatch, match="does not have the expected hash"):
        _verify(path, pubkey, expect_head=head)


def test_torn_tail(make_journal, pubkey):
    path = make_journal(50)
    data = path.read_bytes()
    path.write_bytes(data[:-40])
    with pytest.raises(UnsealedEvents):  # the cut took the last seal: run_closed is no longer signed
        _verify(path, pubkey)
    r = _verify(path, pubkey, allow_unsealed=True)
    assert r.tail == "torn" and r.torn_bytes > 0 and r.ok and r.unsealed_events == 1
    with pytest.raises(NotClosed):
        _verify(path, pubkey, require_closed=True)


def test_non_canonical_line(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    i = _step_index(lines)
    obj = parse(lines[i])
    h = obj.pop("h")
    spaced = dump(obj)[:-1].replace(b",", b", ", 1) + b',"h":"' + h.encode() + b'"}'
    lines[i] = spaced
    write_lines(path, lines)
    with pytest.raises(NonCanonicalRecord) as ei:
        _verify(path, pubkey)
    assert ei.value.seq == i


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda b: b.replace(b'"loss":', b'"loss": ', 1), id="whitespace"),
    pytest.param(lambda b: b.replace(b'"kind":"step_observed",', b'', 1).replace(b'{', b'{"kind":"step_observed",', 1)
                 .replace(b'"step":', b'"lr":0.0003,"step":', 1).replace(b',"lr":0.0003,"step_time', b',"step_time', 1),
                 id="reordered-keys"),
    pytest.param(lambda b: b.replace(b'"tokens":4096', b'"tokens":4096,"tokens":4096', 1), id="duplicate-key"),
    pytest.param(lambda b: b.replace(b'"lr":0.0003', b'"lr":3e-4', 1), id="float-spelling"),
    pytest.param(lambda b: b.replace(b'"lr":0.0003', b'"lr":3.0E-4', 1), id="float-exponent"),
    pytest.param(lambda b: b.replace(b'"tokens":4096', b'"tokens":"4096"', 1), id="number-as-string"),
    pytest.param(lambda b: b.replace(b'"lr":0.0003', b'"lr":0.00030', 1), id="trailing-zero"),
])
def test_non_canonical_variants(make_journal, pubkey, mutate):
    path = make_journal(20)
    lines = read_lines(path)
    i = _step_index(lines)
    new = mutate(lines[i])
    assert new != lines[i]
    lines[i] = new
    write_lines(path, lines)
    with pytest.raises(NonCanonicalRecord):
        _verify(path, pubkey)


def test_seal_moved(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    k = kinds(lines)
    s = k.index("seal", 2)
    seal = lines.pop(s)
    lines.insert(s + 3, seal)
    write_lines(path, rechain(lines, fix_seal_heads=False))
    with pytest.raises(SealInvalid, match="moved or replayed"):
        _verify(path, pubkey)


def test_seal_replayed(make_journal, pubkey):
    path = make_journal(50, close=False)
    lines = read_lines(path)
    first_seal = lines[kinds(lines).index("seal")]
    lines.append(first_seal)
    write_lines(path, rechain(lines, fix_seal_heads=False))
    with pytest.raises(SealInvalid, match="moved or replayed"):
        _verify(path, pubkey)


def test_seal_replayed_with_head_fixed(make_journal, pubkey):
    """Renaming the head a replayed seal covers does not make its signature fit."""
    path = make_journal(50, close=False)
    lines = read_lines(path)
    lines.append(lines[kinds(lines).index("seal")])
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid, match="signature does not verify"):
        _verify(path, pubkey)


def test_forged_seal_signature(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    s = kinds(lines).index("seal", 2)
    obj = parse(lines[s])
    sig = bytearray(base64.b64decode(obj["sig"]))
    sig[0] ^= 0xFF
    obj["sig"] = base64.b64encode(bytes(sig)).decode()
    lines[s] = dump(obj)
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid, match="signature does not verify") as ei:
        _verify(path, pubkey)
    assert ei.value.seq == s


def test_foreign_key_seal(make_journal, pubkey):
    path = make_journal(50)
    lines = read_lines(path)
    s = kinds(lines).index("seal", 2)
    other = Signer.generate()
    obj = parse(lines[s])
    run_id = parse(lines[0])["run_id"]
    obj["key_id"] = other.key_id
    obj["sig"] = base64.b64encode(other.sign(seal_signed_message(run_id, obj["sealed_seq"],
                                                                 bytes.fromhex(obj["sealed_hash"]),
                                                                 bytes.fromhex(obj["tree_root"])))).decode()
    lines[s] = dump(obj)
    write_lines(path, rechain(lines))
    with pytest.raises(SealInvalid, match="foreign-key seal"):
        _verify(path, pubkey)


def test_seq_gap(make_journal, pubkey):
    path = make_journal(30)
    lines = read_lines(path)
    i = _step_index(lines)
    out = lines[:i] + [dump({**parse(x), "seq": parse(x)["seq"] + 1}) for x in lines[i:]]
    write_lines(path, rechain(out, renumber=False))
    with pytest.raises(SequenceError, match="deleted") as ei:
        _verify(path, pubkey)
    assert ei.value.seq == i


def test_unsigned_journal_needs_allow_unsigned(tmp_path):
    path = tmp_path / "u.jsonl"
    with Journal.create(path, background=False) as j:
        j.append(parse_step())
    with pytest.raises(UnsignedJournal):
        verify(path)
    r = verify(path, allow_unsigned=True, require_closed=True)
    assert r.trust == "unsigned" and any("unsigned" in n for n in r.notes)


def test_events_after_close(make_journal, pubkey):
    path = make_journal(10)
    lines = read_lines(path)
    lines.append(lines[_step_index(lines)])
    write_lines(path, rechain(lines))
    with pytest.raises(RunMismatch, match="after run_closed"):
        _verify(path, pubkey)


def parse_step():
    from conftest import step

    return step(0)


def test_a_journal_rewritten_under_replay_fails_as_verify_would(tmp_path, signer, pubkey):
    """Replay reads each block once: it is checked and folded from the same bytes, with no private copy. A step
    rewritten (same length) after replay started, in a block it has not read yet, fails the chain there; nothing
    folded from the journal is returned."""
    import pytest

    from trainledger.audit import replay
    from trainledger.journal import IntegrityError, Journal, StepObserved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(6000):  # about 1.3 MB: several read blocks
            j.append(StepObserved(step=i, loss=2.5, grad_norm=1.0))
    assert replay(p, keys=[pubkey]).ok
    data = p.read_bytes()
    at = data.index(b'"step":5000,"loss":2.5')
    done = []

    def rewrite(ev):
        if not done:
            done.append(ev)
            with open(p, "r+b") as f:
                f.seek(at + len(b'"step":5000,"loss":'))
                f.write(b"9.5")

    with pytest.raises(IntegrityError, match="seq"):
        replay(p, keys=[pubkey], observe=rewrite)
    assert done
