"""The lines a reader hands on beside its events (``scan.Lines``: segments of the blocks where they were read, no
bytes object a line) read as the split lines would: any cut of them taken in turn, any slice, and one Arrow column
of them all, byte for byte, ASCII or not."""

from __future__ import annotations

import array

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal import scan
from trainledger.journal.scan import Lines, lines_of

line = st.binary(max_size=40).filter(lambda b: b"\n" not in b)


def _block(lines: list[bytes]) -> tuple[bytes, memoryview]:
    block = b"".join(x + b"\n" for x in lines)
    ends, at = array.array("I"), -1
    for x in lines:
        at += len(x) + 1
        ends.append(at)
    return block, memoryview(ends.tobytes()).cast("I")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(line, min_size=1, max_size=12), min_size=1, max_size=5), st.lists(st.booleans(), max_size=5),
       st.lists(st.integers(0, 20), max_size=6), st.integers(0, 60), st.integers(0, 60))
def test_lines_read_as_the_split_lines(blocks, split, cuts, a, b):
    want: list[bytes] = []
    pending = Lines()
    for k, ls in enumerate(blocks):
        block, ends = _block(ls)
        assert lines_of(block) == ls
        pending.extend(Lines([(None, lines_of(block), 0, len(ls))]) if k < len(split) and split[k]
                       else Lines([(block, ends, 0, len(ls))]))
        want += ls
    assert len(pending) == len(want) and pending[a:b] == want[a:b] and pending[0:len(want)] == want
    got: list[bytes] = []
    for c in cuts:  # taken a few at a time, as a reader hands on the events a seal covers
        part = pending.take(c)
        assert len(part) == min(c, len(want) - len(got))
        arr, ascii_only = part.binary(pa)
        assert arr.to_pylist() == part[0:len(part)] and ascii_only == all(x.isascii() for x in part[0:len(part)])
        if scan._join_lines is not None:  # joined in C; numpy's way (without the accelerator) gives the same
            joined, scan._join_lines = scan._join_lines, None
            try:
                assert part.binary(pa)[0].to_pylist() == arr.to_pylist()
            finally:
                scan._join_lines = joined
        got += part[0:len(part)]
    got += pending.take(len(pending))[0:len(want)]
    assert got == want and len(pending) == 0
