"""verify's fast path for step_observed lines: a C check of each line against its canonical template
(``step_lines`` in journal/_fast.c) and one msgspec decode and re-encode of all their numbers, instead of
decoding and re-encoding every record. It must never take a line that the full check (decode, re-encode, compare)
would refuse: a refusal only sends the block the ordinary way. Tested as a property against msgspec itself, end to
end on journals rewritten by a key holder, and by the facts verify hands back with the path on and off."""

from __future__ import annotations

import array
import importlib
import math
import platform
import random
import sys
import typing
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_tools import read_lines, rechain, write_lines

from trainledger.journal import Journal, NonCanonicalRecord, StepObserved, load_public_key, verify
from trainledger.journal import codec
from trainledger.journal.verify import Verification, verify_with

scan = importlib.import_module("trainledger.journal.scan")
#: the views' column builder (journal/views/_fastcols.c), or None where it is not built
step_columns = importlib.import_module("trainledger.journal.views.parquet.export")._step_columns
pytestmark = pytest.mark.skipif(not scan._STEP_LINES_OK, reason="the C accelerator is not built")

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


def _ends(block: bytes) -> bytes:
    a = array.array("I")
    i = block.find(b"\n")
    while i >= 0:
        a.append(i)
        i = block.find(b"\n", i + 1)
    return a.tobytes()


@pytest.fixture
def fast_blocks(monkeypatch):
    """How many read blocks verify settled on the fast path (the journals here are checked in this process)."""
    taken = []
    real = scan.Scanner._step_block

    def counted(self, block, ends_b):
        got = real(self, block, ends_b)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(scan.Scanner, "_step_block", counted)
    return taken


def fast_takes(line: bytes) -> bool:
    """What the fast path concludes of one line (no newline): taken whole, or sent the ordinary way. A line it
    takes is also built into its record in C (``step_records``, what replay folds), which must be the record
    msgspec decodes from the line, field for field and type for type."""
    block = line + b"\n"
    ends = _ends(block)
    mask, numbers = scan._step_lines(block, ends)
    values = scan._numbers_canonical(numbers) if numbers != b"[]" else []
    taken = mask == b"\x01" and values is not None
    # verify alone hands msgspec only the numbers the C check cannot prove: the same conclusion
    mask_alone, left = scan._step_lines(block, ends, False)
    assert mask_alone == mask
    assert (mask == b"\x01" and (left == b"[]" or scan._numbers_canonical(left) is not None)) == taken
    # readers take the values the C check read, msgspec's for the rest: exactly msgspec's, type and sign included
    read = scan._step_numbers(block, ends)
    assert (read is not None and read[0] == b"\x01") == taken
    if taken:
        assert list(map(repr, read[1])) == list(map(repr, values))
    if taken and scan._step_records is not None:
        built = scan._step_records(block, ends, mask, values, scan._STEP_T)
        if built is not None:  # None: the block is decoded instead (not an error)
            (rec,) = built
            (want,) = codec.decode_unchecked_block(block)
            assert type(rec) is type(want) and codec._encoder.encode(rec) == codec._encoder.encode(want) == line
            fields = type(want).__struct_fields__
            assert [type(getattr(rec, f)) for f in fields] == [type(getattr(want, f)) for f in fields]
            assert rec == want
    if step_columns is not None:
        _columns_agree(block, ends, mask, taken)
    return taken


def _columns_agree(block: bytes, ends: bytes, mask: bytes, taken: bool) -> None:
    """The fast path's columns (``step_columns``, what an export and a cold query build the steps table from) of a
    one-line block: its mask is the check's; a line the check takes has the cells msgspec's decode of it holds (an
    int in a float field as the double it is, None where the field is absent), or falls back to records (False)
    only for an int past 2^53 in a float field or a ts past int64; a line the check refuses (its numbers spelled
    otherwise) gives None, which sends the block the ordinary way."""
    cols = scan._step_cols(step_columns, block, ends)
    if mask == b"\x01" and not taken:
        assert cols is None
        return
    (want,) = codec.decode_unchecked_block(block) if taken else (None,)
    if cols is False:
        assert taken and (want.ts >= 2**63 or any(
            type(getattr(want, f)) is int and abs(getattr(want, f)) > 2**53 for f in scan._STEP_NUMBERS))
        return
    assert cols.mask == mask and cols.k == (1 if taken else 0)
    (ts,) = array.array("q", cols.ts)
    assert cols.h == block[-67:-3]
    if not taken:
        return
    assert ts == want.ts
    ints = array.array("q", bytes(cols.data))
    floats = array.array("d", bytes(cols.data))
    names = ("step", "loss", "grad_norm", "lr", "step_time_s", "examples", "tokens", "supervised_tokens",
             "data_time_s", "compute_time_s", "batch_fingerprint")
    for c, name in enumerate(names):
        v = getattr(want, name)
        assert cols.valid[c] == (v is not None), name
        if v is None:
            continue
        if name in ("step", "examples", "tokens", "supervised_tokens"):
            assert ints[c] == v, name
        else:
            assert repr(floats[c]) == repr(float(v)), name


def full_check_takes(line: bytes) -> bool:
    return codec.decode_block(line + b"\n") is not None


numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2 ** 63), 2 ** 63 - 1))
ints = st.integers(-(2 ** 63), 2 ** 63 - 1)
steps = st.builds(
    StepObserved, step=ints, loss=numbers, grad_norm=st.none() | numbers, lr=st.none() | numbers,
    step_time_s=st.none() | numbers, examples=st.none() | ints, tokens=st.none() | ints,
    supervised_tokens=st.none() | ints, data_time_s=st.none() | numbers, compute_time_s=st.none() | numbers)


def _write(tmp_path: Path, signer, events) -> list[bytes]:
    p = tmp_path / "j.jsonl"
    if p.exists():
        p.unlink()
    with Journal.create(p, signer=signer, background=False) as j:
        for e in events:
            j.append(e)
    return read_lines(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=8))
def test_every_step_line_the_writer_writes_is_taken(tmp_path, signer, events):
    """Completeness: what the writer writes (every field combination, any int64, any finite float, ints in float
    fields) is taken by the fast path, so real journals get its speed."""
    lines = [x for x in _write(tmp_path, signer, events) if x.startswith(b'{"kind":"step_observed"')]
    assert len(lines) == len(events)
    for line in lines:
        assert fast_takes(line), line


# The genuine lines the mutations start from: every optional field present, none, and some.
_FULL = (b'{"kind":"step_observed","step":12,"loss":2.5,"grad_norm":1.0000000000000002,"lr":0.0003,'
         b'"step_time_s":0.125,"examples":8,"tokens":4096,"supervised_tokens":4000,"data_time_s":1e-7,'
         b'"compute_time_s":0.0625,"seq":40,"ts":1796057490874965094,"h":"' + b"ab" * 32 + b'"}')
_BARE = b'{"kind":"step_observed","step":0,"loss":3,"seq":7,"ts":17,"h":"' + b"0f" * 32 + b'"}'
_SOME = (b'{"kind":"step_observed","step":-5,"loss":-0.0,"lr":1e22,"tokens":0,"compute_time_s":5e-324,'
         b'"seq":123456,"ts":1,"h":"' + b"c3" * 32 + b'"}')
_ALPHABET = b'0123456789.eE+-,:"{} nulltrfaxsNI[]\\'


@pytest.mark.parametrize("line", [_FULL, _BARE, _SOME], ids=["full", "bare", "some"])
def test_the_starting_lines_are_canonical_and_taken(line):
    assert full_check_takes(line) and fast_takes(line)


@settings(max_examples=1200, deadline=None)
@given(st.sampled_from([_FULL, _BARE, _SOME]),
       st.lists(st.tuples(st.sampled_from(["insert", "delete", "replace", "duplicate", "swap"]),
                          st.integers(0, 10 ** 6), st.integers(0, len(_ALPHABET) - 1), st.integers(1, 12)),
                min_size=1, max_size=3))
def test_a_changed_line_is_taken_only_if_the_full_check_takes_it(line, edits):
    """Safety: change the record part of a line in any way (its chain suffix is scan_block's to check, and kept);
    whenever the fast path takes the result, decoding and re-encoding it gives it back byte for byte."""
    cut = line.index(b',"seq":')
    body, suffix = bytearray(line[:cut]), line[cut:]
    for op, at, ch, width in edits:
        i = at % (len(body) + 1)
        if op == "insert":
            body[i:i] = _ALPHABET[ch:ch + 1]
        elif op == "delete" and i < len(body):
            del body[i:i + width]
        elif op == "replace" and i < len(body):
            body[i] = _ALPHABET[ch]
        elif op == "duplicate":
            body[i:i] = body[i:i + width]
        elif op == "swap" and i + 2 * width <= len(body):
            body[i:i + 2 * width] = body[i + width:i + 2 * width] + body[i:i + width]
    changed = bytes(body) + suffix
    if fast_takes(changed):
        assert full_check_takes(changed), changed


@pytest.mark.parametrize("line", [_FULL, _BARE, _SOME], ids=["full", "bare", "some"])
def test_every_one_byte_change_is_taken_only_if_the_full_check_takes_it(line):
    """Exhaustively: every byte of the record part deleted, replaced by or preceded by each character that means
    something in JSON. Some changes are canonical lines still (a digit of a number), and those must be taken."""
    cut = line.index(b',"seq":')
    body, suffix = line[:cut], line[cut:]
    taken = 0
    for i in range(len(body) + 1):
        variants = [body[:i] + bytes([c]) + body[i:] for c in _ALPHABET]
        if i < len(body):
            variants += [body[:i] + body[i + 1:]] + [body[:i] + bytes([c]) + body[i + 1:] for c in _ALPHABET]
        for v in variants:
            changed = v + suffix
            if fast_takes(changed):
                assert full_check_takes(changed), changed
                taken += 1
    assert taken > 20  # not vacuous: changed digits of numbers and ints are lines it takes


@pytest.mark.parametrize("old,new", [
    (b'"loss":2.5', b'"loss":2.50'),
    (b'"loss":2.5', b'"loss":25e-1'),
    (b'"loss":2.5', b'"loss":2.5E0'),
    (b'"lr":0.0003', b'"lr":3e-4'),
    (b'"lr":0.0003', b'"lr":0.00030'),
    (b'"grad_norm":1.0000000000000002', b'"grad_norm":1.00000000000000022'),
    (b'"grad_norm":1.0000000000000002', b'"grad_norm":null'),
    (b'"tokens":4096', b'"tokens":4096.0'),
    (b'"tokens":4096', b'"tokens":04096'),
    (b'"tokens":4096', b'"tokens":"4096"'),
    (b'"step":12', b'"step":-0'),
    (b'"step":12', b'"step":+12'),
    (b'"examples":8,', b'"examples":8,"examples":8,'),
    (b'"examples":8,"tokens":4096', b'"tokens":4096,"examples":8'),
    (b'"examples":8,', b'"examples": 8,'),
    (b'"loss":2.5', b'"loss":NaN'),
    (b'"loss":2.5', b'"loss":Infinity'),
    (b'"kind":"step_observed"', b'"kind":"step_observed "'),
    (b',"supervised_tokens":4000', b',"supervised_tokens":4000,"extra":1'),
    (b'"loss":2.5,', b''),  # a required field left out
    (b',"compute_time_s":0.0625', b',"compute_time_s":0.0625,"seq":40,"ts":1,"x":2'),
    (b',"compute_time_s":0.0625', b',"compute_time_s":0.0625,"seq":40,"ts":1'),
    (b',"compute_time_s":0.0625', b',"seq":40,"ts":1,"compute_time_s":0.0625'),
])
def test_each_known_non_canonical_spelling_goes_the_ordinary_way(old, new):
    changed = _FULL.replace(old, new, 1)
    assert changed != _FULL
    assert not full_check_takes(changed) and not fast_takes(changed)


def test_canonical_lines_the_fast_path_leaves_to_the_full_check():
    """Conservative where it costs nothing: an int beyond int64 (msgspec takes up to 2^64 - 1) is left to the full
    check; a field left out (None) is taken."""
    wide = _FULL.replace(b'"step":12', b'"step":9223372036854775808', 1)
    assert full_check_takes(wide) and not fast_takes(wide)
    fewer = _FULL.replace(b'"examples":8,', b'', 1)
    assert full_check_takes(fewer) and fast_takes(fewer)


def rechain_keeping_bytes(lines: list[bytes], signer) -> list[bytes]:
    """A key holder's rewrite: every line's bytes kept as they are (a non-canonical one too), the chain hashes
    recomputed, and every seal's head, tree root and signature made again with the run's key."""
    return rechain(lines, renumber=False, resign=signer, keep_bytes=True)


@pytest.mark.parametrize("old,new", [
    (b'"lr":0.0003', b'"lr":3e-4'), (b'"lr":0.0003', b'"lr":0.00030'), (b'"tokens":4096', b'"tokens":4096.0'),
    (b'"grad_norm":1.0', b'"grad_norm":null'), (b'"step":3003', b'"step":-0'),
    (b'"tokens":4096', b'"tokens": 4096'),
])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "ordinary"])
def test_a_signed_non_canonical_step_line_fails_verify_either_way(make_journal, signer, pubkey, monkeypatch,
                                                                   fast_blocks, old, new, fast):
    """The run's own key signs a journal whose step 3003 (in a read block of steps and seals alone) is spelled
    otherwise: its chain and seals hold, and verify names that line, with the fast path as without it."""
    monkeypatch.setattr(scan, "_STEP_LINES_OK", fast)
    path = make_journal(6000, seal_every=1000)
    lines = read_lines(path)
    i = next(k for k, x in enumerate(lines) if x.startswith(b'{"kind":"step_observed","step":3003,'))
    assert old in lines[i]
    lines[i] = lines[i].replace(old, new, 1)
    write_lines(path, rechain_keeping_bytes(lines, signer))
    with pytest.raises(NonCanonicalRecord) as ei:
        verify(path, keys=[pubkey])
    assert ei.value.seq == i
    assert any(fast_blocks) == fast  # the blocks before it went the fast way


def _facts(rep) -> tuple:
    return (rep.ok, rep.events, rep.last_seq, rep.last_hash, rep.seals, dict(rep.kinds), rep.tail, rep.head,
            rep.tree.root() if rep.tree is not None else None, rep.unsealed_events)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.jsonl")), ids=lambda p: p.name)
def test_verify_hands_back_the_same_facts_with_and_without_the_fast_path(path, monkeypatch):
    keys = [load_public_key(path.with_suffix(".pub"))]
    monkeypatch.setattr(scan, "_STEP_LINES_OK", False)
    without = verify(path, keys=keys)
    monkeypatch.setattr(scan, "_STEP_LINES_OK", True)
    assert _facts(verify(path, keys=keys)) == _facts(without)


def test_nan_losses_and_anchored_heads_read_the_same_either_way(tmp_path, signer, pubkey, monkeypatch, fast_blocks):
    """Lines the fast path does not take (a NaN loss, an anomaly), seals among steps, and the hashes an anchor
    asks for (read off step lines it never decoded)."""
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, seal_every=37, background=False) as j:
        for s in range(8000):
            # NaN losses (their blocks go line by line, as before) early and late; the middle is steps and seals
            j.append(StepObserved(step=s, loss=math.nan if s in (5, 7950) else 2.0 + 1 / (s + 1), tokens=64))
    want = frozenset({3, 500, 1999, 4000, 4001, 7999})
    reps = []
    for on in (False, True):
        monkeypatch.setattr(scan, "_STEP_LINES_OK", on)
        reps.append(verify_with(p, Verification(collect=(frozenset(), want)), keys=[pubkey]))
    a, b = reps
    assert _facts(a) == _facts(b) and a.ok
    assert a.hashes == b.hashes and set(a.hashes) == want
    assert sum(fast_blocks) >= 3  # the middle blocks went the fast way


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "ordinary"])
def test_a_signed_non_canonical_line_of_another_kind_among_steps_fails_verify(tmp_path, signer, pubkey,
                                                                                monkeypatch, fast_blocks, fast):
    """The lines the fast path does not take are decoded and re-encoded as before: a key holder's anomaly spelled
    otherwise, in a block of step lines, is named."""
    from trainledger.training.kinds import AnomalyDetected

    monkeypatch.setattr(scan, "_STEP_LINES_OK", fast)
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, seal_every=1000, background=False) as j:
        for s in range(8000):  # five read blocks: the anomaly in the third, with no rare kind beside it
            j.append(StepObserved(step=s, loss=2.0 + s / 1000))
            if s == 4000:
                j.append(AnomalyDetected(step=s, anomaly="loss_spike", value=2.5, z_score=9.0))
    lines = read_lines(p)
    i = next(k for k, x in enumerate(lines) if x.startswith(b'{"kind":"anomaly_detected"'))
    lines[i] = lines[i].replace(b'"value":2.5', b'"value":2.50', 1)
    write_lines(p, rechain_keeping_bytes(lines, signer))
    with pytest.raises(NonCanonicalRecord) as ei:
        verify(p, keys=[pubkey])
    assert ei.value.seq == i
    assert any(fast_blocks) == fast


def proven(tokens: list[bytes]) -> list[bool]:
    """Which of these numbers, each the loss of a step line, the C check proves spelled as msgspec writes them
    (``step_lines(..., all=False)`` hands back only the ones it leaves to msgspec, in order; a line that is not
    a step line in canonical form but for its numbers, nothing)."""
    lines = [b'{"kind":"step_observed","step":1,"loss":' + t + b',"seq":5,"ts":1,"h":"' + b"0" * 64 + b'"}'
             for t in tokens]
    block = b"\n".join(lines) + b"\n"
    mask, left = scan._step_lines(block, _ends(block), False)
    rest = left[1:-1].split(b",") if left != b"[]" else []
    out = []
    for t, m in zip(tokens, mask):  # a line not taken (not a JSON number) hands back nothing
        out.append(m == 1 and not (rest and rest[0] == t))
        if m == 1 and not out[-1]:
            rest.pop(0)
    assert not rest
    return out


def _spellings(x: float) -> list[bytes]:
    """msgspec's spelling of x and its near misses: a last digit one off, a digit more or less, printf's."""
    c = msgspec.json.encode(x)
    out = [c]
    s = c.decode()
    if "e" not in s:
        d = int(s[-1])
        out += [(s[:-1] + str(n)).encode() for n in (d - 1, d + 1) if 0 <= n <= 9]
        out += [(s + "1").encode(), (s + "5").encode()]
        if len(s.split(".")[1]) > 1:
            out.append(s[:-1].encode())
    for f in ("%.15f", "%.16f", "%.17f", "%.20f", "%.15g", "%.16g", "%.17g"):
        t = (f % x).encode()
        if b"e" not in t and b"n" not in t and len(t) < 40:
            t = t.rstrip(b"0") if b"." in t else t
            out.append(t + b"0" if t.endswith(b".") else t)
    return out


_MSGSPEC_NUMBER = msgspec.json.Decoder(typing.Union[int, float])  # noqa: UP007


def _canonical(token: bytes) -> bool:
    try:
        return msgspec.json.encode(_MSGSPEC_NUMBER.decode(token)) == token
    except msgspec.DecodeError:
        return False


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                          st.floats(1e-6, 1e17), st.floats(0.5, 12.0),
                          st.builds(lambda m, k: m / 10 ** k, st.integers(1, 10 ** 17), st.integers(0, 21))),
                min_size=1, max_size=20))
def test_a_number_is_proven_only_if_msgspec_writes_it_so(xs):
    """Safety of the C proof of a number's spelling (fixed notation, up to 17 significant digits, decided in
    extended precision with a margin): whatever it proves, msgspec's decode and re-encode gives back byte for
    byte. Near misses (a last digit one off, one digit too many or too few, printf's roundings) are where it would
    go wrong."""
    tokens = [t for x in xs for t in _spellings(x)]
    for t, p in zip(tokens, proven(tokens)):
        if p:
            assert _canonical(t), t
    canonical = [t for t in tokens if _canonical(t)]
    line = b'{"kind":"step_observed","step":1,"loss":%b,"seq":5,"ts":1,"h":"' + b"0" * 64 + b'"}'
    block = b"\n".join(line % t for t in canonical) + b"\n"
    got = scan._step_numbers(block, _ends(block))
    assert got is not None and list(map(repr, got[1])) == [repr(_MSGSPEC_NUMBER.decode(t)) for t in canonical]


@pytest.mark.parametrize("token", [
    b"9999999999999999.0", b"9999999999999998.0", b"0.00001", b"0.000009999999999999999", b"-0", b"-0.0", b"0.0",
    b"1234567890123456789", b"9007199254740993.0", b"9007199254740992.0", b"0.30000000000000004",
    b"0.30000000000000005", b"0.10000000000000001", b"1e16", b"1e-05", b"0.000010000000000000001", b"4096.0",
    b"1.50", b"01.5", b"2.2250738585072014", b"1.7976931348623157", b"1000000000000000.0", b"999999999999999.94",
])
def test_edge_numbers_are_proven_only_if_canonical(token):
    assert not proven([token])[0] or _canonical(token)


def test_the_proof_settles_most_of_a_real_runs_numbers():
    """Not vacuous: of msgspec's own spellings of losses, gradient norms, learning rates and step times, the C
    check proves nearly all (the rest, within its margin or in exponent notation, go to msgspec)."""
    rng = random.Random(0)
    xs = [2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02) for i in range(2000)]
    xs += [0.8 + abs(rng.gauss(0, 0.05)) for _ in range(2000)] + [3e-4 * rng.random() for _ in range(2000)]
    xs += [0.25, 0.125, 4096.0, 1.0, 0.0]
    tokens = [msgspec.json.encode(x) for x in xs]
    got = proven(tokens)
    assert all(map(_canonical, tokens)) and len(got) == len(tokens)
    assert sum(got) >= 0.9 * len(tokens), sum(got)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux",
                    reason="the x87 control word of Linux on x86-64")
def test_a_lowered_x87_precision_leaves_long_numbers_to_msgspec():
    """The proof of 16- and 17-digit numbers needs long double at its 64 bits; a process whose x87 precision was
    lowered (a library's control word) gets them decided by msgspec instead, and the same verdicts."""
    import ctypes
    import ctypes.util
    import struct

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    env = ctypes.create_string_buffer(64)
    assert libm.fegetenv(env) == 0
    low = bytearray(env.raw)
    struct.pack_into("<H", low, 0, (struct.unpack_from("<H", env.raw, 0)[0] & ~0x300) | 0x200)  # 53-bit precision
    tokens = [b"2.6397488227399335", b"0.8522593720794641", b"0.25", b"1.5", b"2.63974882273993"]
    assert proven(tokens) == [True] * 5
    assert libm.fesetenv(ctypes.create_string_buffer(bytes(low), 64)) == 0
    try:
        assert proven(tokens) == [False, False, True, True, True]
        block = b"".join(_FULL.replace(b'"loss":2.5', b'"loss":' + t, 1) + b"\n" for t in tokens)
        got = scan._step_numbers(block, _ends(block))
        assert got is not None and got[0] == b"\x01" * 5
    finally:
        assert libm.fesetenv(env) == 0
    assert proven(tokens) == [True] * 5
