"""The codec: canonical encoding, strict decoding, non-finite floats, new kinds."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal import (
    Event,
    NonCanonicalRecord,
    RunClosed,
    RunOpened,
    RunResumed,
    SchemaError,
    Seal,
    StepObserved,
    TailRepaired,
    UnknownEvent,
    decode_line,
    encode_event,
    encode_record,
)
from trainledger.journal.codec import record_type


def as_line(event, seq=0, ts=1, h="0" * 64) -> bytes:
    return encode_event(event)[:-1] + b',"seq":%d,"ts":%d,"h":"%s"}' % (seq, ts, h.encode())


def same(a, b) -> bool:
    """Equality that treats NaN as equal to NaN (and keeps the sign of infinities)."""
    if isinstance(a, float) and isinstance(b, (float, int)):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def fields_of(ev) -> dict:
    return {f: getattr(ev, f) for f in type(ev).__struct_fields__ if f not in ("seq", "ts", "h")}


floats = st.floats(allow_nan=True, allow_infinity=True)
opt_floats = st.none() | floats
opt_ints = st.none() | st.integers(min_value=0, max_value=2**53)
text = st.text(max_size=20)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | text

_step = st.builds(StepObserved, step=st.integers(0, 2**40), loss=floats, grad_norm=opt_floats, lr=opt_floats,
          step_time_s=opt_floats, examples=opt_ints, tokens=opt_ints, supervised_tokens=opt_ints)
_opened = st.builds(RunOpened, format_version=st.just("1.0"), run_id=st.just("r-1"), key_id=st.none() | st.just("ab" * 8),
          public_key=st.none() | text, host=text, pid=st.integers(0, 2**31), software=st.dictionaries(text, text, max_size=3),
          meta=st.dictionaries(text, json_scalars, max_size=4))
_seal = st.builds(Seal, sealed_seq=st.integers(0, 2**40), sealed_hash=st.just("ab" * 32), key_id=st.none() | st.just("cd" * 8),
          sig=st.none() | text)
_resumed = st.builds(RunResumed, reason=text, from_step=opt_ints, checkpoint=st.none() | text,
          detail=st.dictionaries(text, json_scalars, max_size=3))
_repaired = st.builds(TailRepaired, offset=st.integers(0, 2**40), length=st.integers(0, 2**20), sha256=st.just("ef" * 32), sidecar=text)
_closed = st.builds(RunClosed, status=text, reason=st.none() | text)
events = st.one_of(_step, _opened, _seal, _resumed, _repaired, _closed)
#: the kinds a caller may append (the writer owns run_opened, seal and run_closed)
appendable_events = st.one_of(_step, _resumed, _repaired)


@settings(max_examples=400, deadline=None)
@given(events, st.integers(0, 2**40), st.integers(0, 2**63 - 1))
def test_round_trip_every_kind(event, seq, ts):
    line = as_line(event, seq, ts)
    rec = decode_line(line)
    assert isinstance(rec, type(event)) and rec.seq == seq and rec.ts == ts
    assert same(fields_of(rec), fields_of(event))
    assert encode_record(rec) == line


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_round_trip_exactly(value):
    ev = StepObserved(step=1, loss=value, grad_norm=value)
    line = as_line(ev)
    spelled = {math.inf: b'"Infinity"', -math.inf: b'"-Infinity"'}.get(value, b'"NaN"')
    assert b'"loss":' + spelled in line
    rec = decode_line(line)
    if math.isnan(value):
        assert math.isnan(rec.loss) and math.isnan(rec.grad_norm)
    else:
        assert rec.loss == value and rec.grad_norm == value


def test_none_is_not_nan():
    a = decode_line(as_line(StepObserved(step=1, loss=1.0, grad_norm=None)))
    b = decode_line(as_line(StepObserved(step=1, loss=1.0, grad_norm=math.nan)))
    assert a.grad_norm is None and math.isnan(b.grad_norm)


def test_defaults_are_omitted_and_explicit_null_is_non_canonical():
    line = as_line(StepObserved(step=1, loss=1.0))
    assert b"grad_norm" not in line
    with pytest.raises(NonCanonicalRecord):
        decode_line(line.replace(b'"loss":1.0', b'"loss":1.0,"grad_norm":null'))


def test_int_in_float_field_is_written_canonically():
    line = as_line(StepObserved(step=1, loss=3, lr=0))
    rec = decode_line(line)
    assert rec.loss == 3 and rec.lr == 0 and encode_record(rec) == line


def test_float_in_int_field_is_normalized():
    assert encode_event(StepObserved(step=3.0, loss=1.0)) == encode_event(StepObserved(step=3, loss=1.0))
    with pytest.raises(TypeError, match="StepObserved"):
        encode_event(StepObserved(step=3.5, loss=1.0))


@pytest.mark.parametrize("bad", [{"loss": None}, {"loss": "3.0x"}, {"tokens": True}, {"loss": object()}])
def test_wrong_types_are_refused_before_anything_is_written(bad):
    kw = {"step": 1, "loss": 1.0, **bad}
    with pytest.raises(TypeError):
        encode_event(StepObserved(**kw))


def test_string_containing_null_text():
    ev = RunClosed(status="null", reason="null and NaN")
    rec = decode_line(as_line(ev))
    assert rec.status == "null" and rec.reason == "null and NaN"


def test_nan_inside_nested_meta_is_spelled():
    line = as_line(RunResumed(reason="x", detail={"loss": math.nan, "vals": [1.0, math.inf]}))
    assert b'"loss":"NaN"' in line and b'"Infinity"' in line
    assert encode_record(decode_line(line)) == line


def test_unicode_round_trip():
    ev = RunClosed(status="ok", reason="λ → ∞ \u2028 \x00 \"q\" \\")
    rec = decode_line(as_line(ev))
    assert rec.reason == ev.reason


@pytest.mark.parametrize("line", [
    b"", b"not json", b"[1,2]", b'{"kind":"step_observed"}', b'{"kind":5,"seq":0,"ts":0,"h":""}',
    b'{"kind":"step_observed","step":1,"loss":"abc","seq":0,"ts":0,"h":"x"}',
    b'{"kind":"Bad Kind","seq":0,"ts":0,"h":"x"}',
    b'\xff\xfe{"kind":"x"}',
])
def test_malformed_lines_are_schema_errors(line):
    with pytest.raises(SchemaError):
        decode_line(line)


def test_unknown_kind_round_trips_as_unknown_event():
    line = b'{"kind":"gate_decided","verdict":"go","margin":0.25,"seq":7,"ts":9,"h":"' + b"0" * 64 + b'"}'
    rec = decode_line(line)
    assert type(rec) is UnknownEvent and rec.kind == "gate_decided" and rec.fields == {"verdict": "go", "margin": 0.25}
    assert encode_record(rec) == line
    with pytest.raises(NonCanonicalRecord):
        decode_line(line.replace(b'"margin":0.25', b'"margin":0.250'))


def test_new_kinds_need_no_core_change():
    class GateDecided(Event, tag="gate_decided_test", frozen=True, kw_only=True):
        rung: str
        passed: bool
        margin: float | None = None

    ev = GateDecided(rung="r1", passed=True, margin=math.inf)
    rec = decode_line(as_line(ev, seq=3))
    assert isinstance(rec, GateDecided) and rec.margin == math.inf and rec.passed is True


def test_reserved_field_names_are_refused():
    class Bad(Event, tag="bad_reserved_test", frozen=True, kw_only=True):
        seq: int

    with pytest.raises(TypeError, match="reserved"):
        encode_event(Bad(seq=1))


def test_records_cannot_be_appended_as_events():
    rec = decode_line(as_line(StepObserved(step=1, loss=1.0)))
    with pytest.raises(TypeError, match="not an event class"):
        encode_event(rec)


def test_record_types_are_subclasses():
    assert issubclass(record_type(StepObserved), StepObserved)
    assert record_type(StepObserved).__struct_fields__[-3:] == ("seq", "ts", "h")


def test_no_other_module_encodes_json():
    """One codec module owns encoding; nothing else calls msgspec.json.encode."""
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[3] / "journal"
    offenders = [p.name for p in pkg.glob("*.py") if p.name != "codec.py" and "msgspec.json.encode" in p.read_text()]
    assert offenders == []
    assert msgspec  # imported for the check above to be meaningful


@settings(max_examples=200, deadline=None)
@given(st.lists(events, min_size=1, max_size=20))
def test_decode_block_is_decode_line_for_canonical_blocks(evs):
    from trainledger.journal.codec import decode_block

    lines = [as_line(ev, seq=i, ts=i + 1, h=f"{i:064x}") for i, ev in enumerate(evs)]
    recs = decode_block(b"".join(x + b"\n" for x in lines))
    if recs is None:  # non-finite floats are spelled as strings, which only the line-by-line path reads
        assert any(b'"NaN"' in x or b'Infinity"' in x for x in lines)
        return
    assert len(recs) == len(lines)
    assert all(same(fields_of(r), fields_of(decode_line(x))) and type(r) is type(decode_line(x))
               for r, x in zip(recs, lines))


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda ls: [ls[0].replace(b'"loss":', b'"loss": ', 1)] + ls[1:], id="whitespace"),
    pytest.param(lambda ls: [ls[0].replace(b'"examples":8', b'"examples":8,"examples":8', 1)] + ls[1:],
                 id="duplicate-key"),
    pytest.param(lambda ls: [ls[0].replace(b'"lr":0.0003', b'"lr":3e-4', 1)] + ls[1:], id="float-spelling"),
    pytest.param(lambda ls: [ls[0] + b"," + ls[1]] + ls[2:], id="two-events-on-a-line"),
    pytest.param(lambda ls: [ls[0] + ls[1]] + ls[2:], id="two-events-glued"),
    pytest.param(lambda ls: [ls[0], b""] + ls[1:], id="empty-line"),
    pytest.param(lambda ls: [ls[0], b"   "] + ls[1:], id="blank-line"),
    pytest.param(lambda ls: [ls[0] + b"\r"] + ls[1:], id="crlf"),
    pytest.param(lambda ls: [ls[0].replace(b"step_observed", b"step_observed_v9", 1)] + ls[1:], id="unknown-kind"),
    pytest.param(lambda ls: [ls[0][:-1] + b',"extra":1}'] + ls[1:], id="extra-field"),
])
def test_decode_block_refuses_what_is_not_one_canonical_record_per_line(mutate):
    """The block fast path says None (the line-by-line path then names the line) for anything that is not the
    canonical encoding of one known record on each line."""
    from trainledger.journal.codec import decode_block

    evs = [StepObserved(step=s, loss=2.5, lr=0.0003, examples=8) for s in range(3)]
    lines = [as_line(ev, seq=i, ts=7, h="ab" * 32) for i, ev in enumerate(evs)]
    assert decode_block(b"".join(x + b"\n" for x in lines)) is not None
    changed = mutate(list(lines))
    assert changed != lines
    assert decode_block(b"".join(x + b"\n" for x in changed)) is None
