"""The export's columns from verified records (``arrow_columns``: the numeric fields of a table in one pass over
the records, in C) are the columns pyarrow builds from the same values one by one: nulls, an int where a float was
expected, an int beyond 64 bits, booleans, records of another type among them."""

from __future__ import annotations

import random

import msgspec
import pytest

pa = pytest.importorskip("pyarrow")

from trainledger.journal.views.parquet import export  # noqa: E402


class Rec(msgspec.Struct):
    a: float | None
    b: int | None
    c: bool | None
    d: str | None
    e: int


class Other(msgspec.Struct):
    a: float | None
    b: int | None
    c: bool | None
    d: str | None
    e: int


NAMES, DUCKS = ["a", "b", "c", "d", "e"], ["DOUBLE", "BIGINT", "BOOLEAN", "VARCHAR", "HUGEINT"]
TYPES = [pa.float64(), pa.int64(), pa.bool_(), pa.string(), pa.decimal128(38, 0)]


def _reference(recs):
    return [pa.array([getattr(r, n) for r in recs], t) for n, t in zip(NAMES, TYPES)]


@pytest.mark.parametrize("seed", range(6))
def test_arrow_columns_are_the_values_one_by_one(seed):
    rng = random.Random(seed)
    recs = []
    for i in range(rng.choice([0, 1, 7, 8, 9, 300])):
        cls = Other if rng.random() < 0.05 else Rec
        recs.append(cls(a=rng.choice([None, rng.random(), -0.0, 1e300]), b=rng.choice([None, i, -(2 ** 63)]),
                        c=rng.choice([None, True, False]), d=rng.choice([None, "x", "é"]), e=rng.choice([i, 2 ** 62])))
    if seed == 3 and recs:
        recs[-1].a = 2  # an int in a float field: that column is built value by value, the others still in C
    if seed == 4 and recs:
        recs[0].e = 2 ** 70  # beyond 64 bits: the decimal column value by value
    got = export.arrow_columns(recs, NAMES, DUCKS)
    for name, g, want in zip(NAMES, got, _reference(recs)):
        assert g.type == want.type, name
        assert g.to_pylist() == want.to_pylist(), name
        assert g.null_count == want.null_count, name


def test_arrow_columns_take_the_c_pass_for_plain_records():
    if export._record_columns is None:
        pytest.skip("the C accelerator is not built")
    recs = [Rec(a=0.5, b=i, c=i % 2 == 0, d=None, e=i) for i in range(100)]
    got = export._record_columns(recs, ("a", "b", "c", "e"), ("d", "q", "b", "q"))
    assert all(x is not None for x in got) and got[1][2] == 0 and got[1][1] is None  # no nulls: no validity
    recs[5].b = None
    recs[6].a = 1  # not a float: that column alone is left to pyarrow
    got = export._record_columns(recs, ("a", "b", "c", "e"), ("d", "q", "b", "q"))
    assert got[0] is None and got[1][2] == 1 and got[2] is not None and got[3] is not None
    with pytest.raises(ValueError):
        export._record_columns(recs, ("a",), ("x",))
    with pytest.raises(TypeError):
        export._record_columns(recs, ("a", "b"), ("d",))
