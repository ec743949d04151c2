"""The accelerator's append (WriterCore): the common case in C writes exactly the bytes the Python append writes,
and everything else reaches the Python append, which decides as before."""

from __future__ import annotations

import math
import threading

import msgspec
import pytest
from journal_tools import read_lines

from trainledger.journal import Journal, JournalClosed, StepObserved, verify
from trainledger.journal import writer

pytestmark = pytest.mark.skipif(writer._Base is object, reason="the C accelerator is not built")

#: values the C check takes (exact ints within int64, finite floats, None where the field allows it) and values it
#: sends to the Python append (bools, floats in an int field, non-finite floats, ints past int64)
VALUES = [
    dict(step=0, loss=2.5),
    dict(step=1, loss=3, grad_norm=0.5, lr=1e-3, step_time_s=0.25, tokens=4096, examples=8),
    dict(step=2, loss=-0.0, lr=5e-324, tokens=2 ** 63 - 1),
    dict(step=3, loss=1e308, compute_time_s=1e-300),
    dict(step=4, loss=float("nan")),
    dict(step=5, loss=math.inf, grad_norm=-math.inf),
    dict(step=6, loss=True),
    dict(step=7.0, loss=1.0),
    dict(step=2 ** 64, loss=1.0),
    dict(step=9, loss=1.0, tokens=-(2 ** 63)),
]


def _body(line: bytes) -> bytes:
    return line[:line.index(b',"seq":')]


def _write(path, signer, append_name):
    out = []
    with Journal.create(path, signer=signer, background=False) as j:
        append = getattr(j, append_name)
        for v in VALUES:
            try:
                out.append(append(StepObserved(**v))[0])
            except (TypeError, ValueError) as e:
                out.append(type(e).__name__)
    return out


def test_the_c_append_writes_what_the_python_append_writes(tmp_path, signer, pubkey):
    fast = _write(tmp_path / "c.jsonl", signer, "append")
    slow = _write(tmp_path / "py.jsonl", signer, "_append_py")
    assert fast == slow  # the same seqs, and the same refusals
    a, b = read_lines(tmp_path / "c.jsonl"), read_lines(tmp_path / "py.jsonl")
    steps = [[_body(x) for x in lines if x.startswith(b'{"kind":"step_observed"')] for lines in (a, b)]
    assert len(steps[0]) == len(VALUES) - fast.count("TypeError") - fast.count("ValueError") >= 6
    assert steps[0] == steps[1]
    for p in ("c.jsonl", "py.jsonl"):
        assert verify(tmp_path / p, keys=[pubkey], require_closed=True).ok


def test_each_append_returns_its_seq_and_the_hash_its_line_carries(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False, seal_every=7) as j:
        got = [j.append(StepObserved(step=i, loss=1.0 / (i + 1))) for i in range(40)]
        assert j._last[1] == StepObserved(step=39, loss=1.0 / 40) and j._last[0] == j._seq
    lines = {msgspec.json.decode(x)["seq"]: msgspec.json.decode(x) for x in read_lines(tmp_path / "j.jsonl")}
    for seq, hx in got:
        assert isinstance(hx, str) and lines[seq]["h"] == hx and lines[seq]["kind"] == "step_observed"
    kinds = [lines[s]["kind"] for s in sorted(lines)]
    assert kinds.count("seal") >= 40 // 7  # the seals came due inside the C path, every seventh event


def test_a_deferred_event_waiting_is_written_before_the_next_append(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False) as j:
        j.append_deferred(StepObserved(step=0, loss=1.0))
        j.append(StepObserved(step=1, loss=1.0))
    steps = [msgspec.json.decode(x).get("step") for x in read_lines(tmp_path / "j.jsonl")]
    assert [s for s in steps if s is not None] == [0, 1]


def test_a_durable_append_and_a_closed_journal_take_the_python_path(tmp_path, signer):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, background=False)
    seq, _ = j.append(StepObserved(step=0, loss=1.0), durable=True)
    assert j._since_seal == 0  # sealed at once
    j.close()
    with pytest.raises(JournalClosed):
        j.append(StepObserved(step=1, loss=1.0))


def test_threads_appending_through_the_c_path_keep_one_chain(tmp_path, signer, pubkey):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, seal_every=50)

    def work(k):
        for i in range(500):
            j.append(StepObserved(step=k * 1000 + i, loss=float(i)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    j.close()
    rep = verify(tmp_path / "j.jsonl", keys=[pubkey], require_closed=True)
    assert rep.ok and rep.kinds["step_observed"] == 2000


def test_an_interval_past_64_bits_is_never_reached(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False, seal_interval_s=1e12,
                        flush_interval_s=1e12) as j:
        j.append(StepObserved(step=0, loss=1.0))
        assert j._seal_interval_ns == writer._NEVER_NS
