"""The optional C accelerator and the hashlib path compute the same chain.

STYLE: keep the obviously-correct version beside the optimised one and test
that they agree. The hashlib path is journal.chain.link; the accelerator is
journal._fast, the format core's (built by setup.py where a compiler and OpenSSL headers exist). The health
folds' accelerator is held to its Python lines in tests/unit/training/test_fold_steps.py, the views' column
builders in tests/unit/journal/test_export_columns.py and test_step_lines.py.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainledger.journal.chain import LINE_TAG, link

fast = pytest.importorskip("trainledger.journal._fast", reason="C accelerator not built here; hashlib path only")


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(max_size=2000))
def test_line_hash_matches_hashlib(prev, prefix):
    assert fast.line_hash(prev, prefix) == link(prev, prefix) == hashlib.sha256(LINE_TAG + prev + prefix).digest()


def _chain(prev: bytes, payloads: list[bytes], first_seq: int = 0) -> list[bytes]:
    out = []
    for i, payload in enumerate(payloads):
        body = b'{"kind":"x","v":"' + payload + b'","seq":%d,"ts":%d' % (first_seq + i, 1764374400000000000 + i)
        h = link(prev, body)
        out.append(body + b',"h":"' + h.hex().encode() + b'"}')
        prev = h
    return out


payload = st.binary(max_size=300).filter(lambda b: b'},{"kind":"' not in b)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.lists(payload, max_size=30), st.integers(0, 2**40), st.data())
def test_check_lines_names_the_first_bad_line(prev, payloads, first_seq, data):
    lines = _chain(prev, payloads, first_seq)
    assert fast.check_lines(prev, lines, first_seq) == -1
    if lines:
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines[i]) - 1))
        bad = bytearray(lines[i])
        bad[j] ^= data.draw(st.integers(1, 255))
        lines[i] = bytes(bad)
        assert fast.check_lines(prev, lines, first_seq) == i  # whatever byte changed, that line is named


def test_check_lines_structure_rules():
    prev = bytes(32)
    lines = _chain(prev, [b"a", b"b", b"c"], first_seq=7)
    assert fast.check_lines(prev, lines, 7) == -1
    assert fast.check_lines(prev, lines, 6) == 0  # seq off by one
    assert fast.check_lines(prev, [lines[0], lines[2]], 7) == 1  # a deleted line
    assert fast.check_lines(prev, [lines[0].upper()], 7) == 0
    assert fast.check_lines(prev, [b"short"], 7) == 0
    two = _chain(prev, [b'q"},{"kind":"y'], 7)
    assert fast.check_lines(prev, two, 7) == 0  # two objects on one line
    with pytest.raises(TypeError):
        fast.check_lines(prev, ["not bytes"], 0)
    with pytest.raises(TypeError):
        fast.line_hash(b"short", b"x")


@pytest.fixture(params=["sha-ni", "openssl"])
def sha_path(request):
    """Both batch-hashing paths of the accelerator: the x86 SHA extensions four lanes at a time (where the CPU has
    them: elsewhere both runs take OpenSSL), and OpenSSL one message at a time. It only sets a mode, so hypothesis's
    examples may share it."""
    before = fast.sha_ni()
    fast.sha_ni(request.param == "sha-ni")
    yield request.param
    fast.sha_ni(before)


def _leaf(line: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + line).digest()


line_payload = payload.filter(lambda b: b"\n" not in b)  # a journal line never holds a raw newline


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=32, max_size=32), st.lists(line_payload, max_size=40), st.integers(0, 2**40), st.data())
def test_scan_block_agrees_with_check_lines_and_the_leaves(sha_path, prev, payloads, first_seq, data):
    lines = _chain(prev, payloads, first_seq)
    block = b"".join(x + b"\n" for x in lines)
    bad, ends, last, leaves = fast.scan_block(prev, block, first_seq, True)
    assert bad == -1
    assert list(memoryview(ends).cast("I")) == [len(b"".join(x + b"\n" for x in lines[:i + 1])) - 1
                                                 for i in range(len(lines))]
    assert last == (bytes.fromhex(lines[-1][-66:-2].decode()) if lines else prev)
    assert leaves == b"".join(map(_leaf, lines))
    assert fast.scan_block(prev, block, first_seq, False)[3] is None
    if lines:
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines[i]) - 1))
        changed = bytearray(lines[i])
        changed[j] ^= data.draw(st.integers(1, 255))
        if b"\n" not in changed:
            lines[i] = bytes(changed)
            assert fast.scan_block(prev, b"".join(x + b"\n" for x in lines), first_seq, True)[0] == i


def test_scan_block_hashes_every_message_length(sha_path):
    """Chain and leaf messages of every length mod 64 (the padding's cases: the 0x80 and the length in the same
    block or the next, a message that ends on a block boundary), against hashlib."""
    prev = bytes(range(32))
    lines = _chain(prev, [b"a" * k for k in range(0, 200)], 3)
    block = b"".join(x + b"\n" for x in lines)
    bad, _, last, leaves = fast.scan_block(prev, block, 3, True)
    assert bad == -1 and leaves == b"".join(map(_leaf, lines))
    assert last == bytes.fromhex(lines[-1][-66:-2].decode())
    # every chain hash was recomputed: one stored hash changed anywhere is named
    for i in (0, 1, 63, 64, 199):
        broken = list(lines)
        h = broken[i][-66:-2]
        broken[i] = broken[i][:-66] + (b"0" if h[:1] != b"0" else b"1") + h[1:] + b'"}'
        assert fast.scan_block(prev, b"".join(x + b"\n" for x in broken), 3, True)[0] == i


def test_scan_block_with_a_huge_line(sha_path):
    """A block far larger than a read holds a huge line (up to 16 MiB is legal): its lines are counted rather than
    bounded by the block's size, and checked the same."""
    prev = bytes(32)
    lines = _chain(prev, [b"a", b"b" * (2 << 20), b"c"], 0)
    block = b"".join(x + b"\n" for x in lines)
    bad, ends, last, leaves = fast.scan_block(prev, block, 0, True)
    assert bad == -1 and len(ends) == 12 and leaves == b"".join(map(_leaf, lines))
    assert fast.scan_block(prev, block.replace(b"bbbb", b"bbbc", 1), 0, True)[0] == 1


def test_scan_block_structure_rules(sha_path):
    prev = bytes(32)
    lines = _chain(prev, [b"a", b"b", b"c"], first_seq=7)
    block = b"".join(x + b"\n" for x in lines)
    assert fast.scan_block(prev, block, 7, True)[0] == -1
    assert fast.scan_block(prev, block, 6, True)[0] == 0  # seq off by one
    assert fast.scan_block(prev, lines[0] + b"\n" + lines[2] + b"\n", 7, True)[0] == 1  # a deleted line
    assert fast.scan_block(prev, lines[0].upper() + b"\n", 7, True)[0] == 0  # upper-case hex is not canonical
    assert fast.scan_block(prev, lines[0] + b"\n\n" + lines[1] + b"\n", 7, True)[0] == 1  # an empty line
    assert fast.scan_block(prev, lines[0] + b"\r\n", 7, True)[0] == 0
    assert fast.scan_block(prev, b"short\n" * 5000, 7, True)[0] == 0  # many short lines: the first is named
    with pytest.raises(ValueError):
        fast.scan_block(prev, lines[0], 7, True)  # no newline at the end: not a block of complete lines
    with pytest.raises(TypeError):
        fast.scan_block(b"short", block, 7, True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**40), st.lists(st.binary(min_size=32, max_size=32), max_size=70), st.integers(0, 5))
def test_hash_range_and_range_merge_agree_with_the_python_lines(sha_path, begin, leaves, cut):
    from trainledger.journal import merkle

    hashes = b"".join(leaves)
    assert fast.hash_range(begin, hashes) == merkle._py_hash_range(begin, hashes)
    assert fast.hash_range(begin, memoryview(hashes)) == merkle._py_hash_range(begin, hashes)
    # a tree from leaf 0 in two ranges, merged in C and in Python, folds to the same root as a CompactTree
    k = min(cut * 7, len(leaves))
    c, p = merkle.CompactRange(0), merkle.CompactRange(0)
    for a, b in ((0, k), (k, len(leaves))):
        part = merkle.CompactRange(a)
        part._nodes, part.end = merkle._py_hash_range(a, b"".join(leaves[a:b])), b
        c.end = fast.range_merge(c._nodes, c.end, list(part._nodes))
        for height, h in part._nodes:
            p._push(height, h)
    assert c._nodes == p._nodes and c.end == p.end
    tree = merkle.CompactTree()
    for x in leaves:
        tree.append(x)
    assert (fast.range_root(c._nodes) if c._nodes else merkle.EMPTY_ROOT) == tree.root()
    with pytest.raises(ValueError):
        fast.hash_range(0, b"x" * 33)
    with pytest.raises(ValueError):
        fast.range_merge([], 1, [(1, bytes(32))])  # a subtree of 2 leaves cannot land at leaf 1
    with pytest.raises(TypeError):
        fast.range_merge([], 0, [(0, b"short")])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**40), st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")), max_size=40),
       st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")))
def test_block_range_is_leaf_range_of_the_lines_as_they_lie(sha_path, begin, lines, before):
    """The writer's buffer joins its tree unsplit: a block's whole lines, after whatever precedes start (a part
    already hashed), give leaf_range's nodes, in a bytearray or bytes, on both hashing paths."""
    from trainledger.journal import merkle

    head = before + b"\n" if before else b""
    block = bytearray(head + b"".join(x + b"\n" for x in lines))
    want = merkle._py_leaf_range(begin, lines)
    assert fast.block_range(begin, block, len(head)) == want == fast.block_range(begin, bytes(block), len(head))
    r = merkle.range_of_block(begin, block, len(head))
    assert r._nodes == want and r.end == begin + len(lines)
    with pytest.raises(ValueError):
        fast.block_range(begin, block + b"x", len(head))  # a last line not whole
    with pytest.raises(ValueError):
        fast.block_range(begin, block, len(block) + 1)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(max_size=600).filter(lambda b: b"}" not in b),
       st.integers(0, 2 ** 64 - 1), st.integers(0, 2 ** 64 - 1), st.binary(max_size=40))
def test_chain_append_writes_the_line_the_python_lines_write(prev, payload, seq, ts, before):
    """The writer's one-call append: the same line (body less its brace, seq, ts, hash) and the same hash as the
    formatting and link() it stands in for, added to what the buffer held."""
    body = b'{"kind":"x","v":"' + payload + b'"}'
    buf = bytearray(before)
    h, hx = fast.chain_append(buf, body, prev, seq, ts)
    prefix = b'%b,"seq":%d,"ts":%d' % (body[:-1], seq, ts)
    assert h == link(prev, prefix) and hx == h.hex().encode()
    assert bytes(buf) == before + prefix + b',"h":"' + hx + b'"}\n'


def test_chain_append_refuses_what_is_not_an_event():
    buf = bytearray(b"kept")
    for body, prev, seq in [(b"", b"\0" * 32, 0), (b"{", b"\0" * 32, 0), (b'{"a":1', b"\0" * 32, 0),
                            (b'{"a":1}', b"\0" * 31, 0), (b'{"a":1}', b"\0" * 32, -1)]:
        with pytest.raises((ValueError, TypeError, OverflowError)):
            fast.chain_append(buf, body, prev, seq, 0)
        assert buf == b"kept"


def test_the_writer_s_scalar_check_takes_only_plainly_right_values():
    """A step_observed whose values are exact ints within int64 and finite floats (None where the field may be) is
    encoded without the decode check; anything else (a bool, a NaN, a float subclass, an int past int64, a string)
    goes the checked way, which normalizes or refuses it as before."""
    import math

    import numpy as np

    from trainledger.journal import StepObserved, codec

    encode = codec.encoder_for(StepObserved)
    spec = codec.scalar_spec(StepObserved)  # what the writer's C append checks with, too
    if spec is None:
        pytest.skip("the writer takes the C check only with the accelerator on (TRAINLEDGER_NO_ACCEL is set)")
    offsets, kinds = spec
    assert (offsets, kinds) == (encode.args[2], encode.args[3])
    assert set(kinds) <= set(b"iIfF") and len(kinds) == len(StepObserved.__struct_fields__)

    def plain(**kw):
        return fast.scalars_ok(StepObserved(**kw), offsets, kinds)

    assert plain(step=3, loss=2.5, grad_norm=None, tokens=4096)
    assert plain(step=3, loss=2, lr=1e-4)
    for kw in [dict(step=True, loss=2.5), dict(step=3, loss=math.nan), dict(step=3, loss=math.inf),
               dict(step=3, loss=np.float64(2.5)), dict(step=2 ** 63, loss=1.0), dict(step=3, loss="2.5"),
               dict(step=3.0, loss=2.5), dict(step=3, loss=2.5, tokens=4096.0)]:
        assert not plain(**kw), kw
    # the checked way decides those, as it always did
    with pytest.raises(TypeError):  # msgspec does not encode numpy's scalars: the caller passes float(x)
        encode(StepObserved(step=3, loss=np.float64(2.5)))
    with pytest.raises(TypeError):
        encode(StepObserved(step=True, loss=2.5))
    assert encode(StepObserved(step=3, loss=math.nan)) == b'{"kind":"step_observed","step":3,"loss":"NaN"}'
    assert encode(StepObserved(step=3, loss="2.5")) == b'{"kind":"step_observed","step":3,"loss":2.5}'  # normalized
    assert encode(StepObserved(step=3, loss=2.5, lr=None)) == b'{"kind":"step_observed","step":3,"loss":2.5}'
