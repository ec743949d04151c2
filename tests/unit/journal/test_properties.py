"""Property tests: random event streams verify and read back; any single-byte change is caught."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codec import appendable_events, fields_of, same

from trainledger.journal import IntegrityError, Journal, JournalError, Signer, read_events, verify

SIGNER = Signer.generate()  # hypothesis reuses it across examples; key generation is not under test here

# The writer owns run_opened, seal and run_closed; everything else may be appended (drawn directly, not filtered:
# a filter that drops half the draws trips hypothesis's health check by chance).
stream_events = appendable_events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(stream_events, max_size=60), st.integers(1, 25), st.booleans())
def test_random_streams_verify_and_read_back(tmp_path_factory, evs, seal_every, signed):
    path = tmp_path_factory.mktemp("s") / "j.jsonl"
    signer = SIGNER if signed else None
    with Journal.create(path, signer=signer, seal_every=seal_every, background=False) as j:
        for e in evs:
            j.append(e)
    r = verify(path, keys=[SIGNER.public], allow_unsigned=not signed, require_closed=True)
    assert r.ok and r.unsealed_events == 0
    user = [e for e in read_events(path) if type(e).__struct_config__.tag not in ("run_opened", "seal")][:-1]
    assert len(user) == len(evs)
    for got, want in zip(user, evs):
        assert isinstance(got, type(want)) and same(fields_of(got), fields_of(want))


@pytest.fixture(scope="module")
def small_closed_journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("flip") / "j.jsonl"
    with Journal.create(path, signer=SIGNER, run_id="flip", seal_every=3, background=False) as j:
        for i in range(8):
            j.append(_step(i))
    return path.read_bytes()


def _step(i):
    from conftest import step

    return step(i, loss=[2.5, math.nan, math.inf, 1e-9][i % 4])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_single_byte_change_is_detected(tmp_path_factory, small_closed_journal, data):
    original = small_closed_journal
    pos = data.draw(st.integers(0, len(original) - 1), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != original[pos]), label="byte")
    mutated = bytearray(original)
    mutated[pos] = new
    path = tmp_path_factory.mktemp("m") / "j.jsonl"
    path.write_bytes(bytes(mutated))
    with pytest.raises(JournalError) as ei:
        verify(path, keys=[SIGNER.public], require_closed=True)
    # A changed byte is an integrity failure; the one exception is a bumped format
    # major version, which is refused as unsupported (exit 2) before anything else.
    assert isinstance(ei.value, IntegrityError) or "newer than this trainledger" in str(ei.value)
