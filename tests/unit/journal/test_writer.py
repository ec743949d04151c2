"""The writer: appends, seals, durability, locking, reopening, threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import step
from journal_tools import kinds, parse, read_lines

from trainledger.journal import (
    Journal,
    JournalClosed,
    JournalLocked,
    RunClosed,
    RunResumed,
    Seal,
    Signer,
    UsageError,
    read_events,
    verify,
)


def test_append_returns_seq_and_hash(tmp_path, signer, pubkey):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, run_id="r1", background=False) as j:
        seq, h = j.append(step(0))
        assert seq == 2 and len(h) == 64  # run_opened and its seal come first
        assert j.head == (2, h)
    recs = list(read_events(tmp_path / "j.jsonl"))
    assert recs[2].h == h and recs[2].seq == 2


def test_create_refuses_existing_file(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    p.write_text("precious\n")
    with pytest.raises(UsageError, match="already exists"):
        Journal.create(p, signer=signer)
    assert p.read_text() == "precious\n"


def test_bad_run_id(tmp_path):
    with pytest.raises(UsageError, match="run id"):
        Journal.create(tmp_path / "j.jsonl", run_id="has space")


def test_seal_policy_every_n(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, seal_every=7, seal_interval_s=3600, background=False) as j:
        for i in range(70):
            j.append(step(i))
    k = kinds(read_lines(p))
    # a seal after run_opened, one per 7 steps, and the closing one
    assert k.count("seal") == 1 + 10 + 1
    assert verify(p, keys=[pubkey], require_closed=True).unsealed_events == 0


def test_seal_policy_every_t_seconds(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, seal_every=10**9, seal_interval_s=0.05, background=False) as j:
        for i in range(5):
            j.append(step(i))
            time.sleep(0.06)
    assert kinds(read_lines(p)).count("seal") >= 1 + 4


def test_explicit_seal_and_durable_append(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, seal_every=10**6, seal_interval_s=3600, background=False)
    seq, h = j.append(step(0))
    assert seq == 2 and j.head == (seq, h)
    assert j.seal() == (seq, h)  # the seal names the head just appended: its seq and its chain hash
    assert j.seal() is None  # nothing new to seal
    j.append(step(1), durable=True)
    # Everything so far is on disk (no buffered bytes): another reader sees it sealed.
    r = verify(p, keys=[pubkey])
    assert r.tail == "open" and r.unsealed_events == 0 and r.last_sealed_seq == 4
    line = parse(read_lines(p)[2])  # the hash append returned is the one the line carries, and the one verify checked
    assert line["seq"] == 2 and line["h"] == h
    j.close()


def test_flush_interval_reaches_the_os(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, seal_every=10**6, seal_interval_s=3600, flush_interval_s=0.05)
    size0 = p.stat().st_size
    j.append(step(0))
    deadline = time.time() + 5
    while p.stat().st_size == size0 and time.time() < deadline:
        time.sleep(0.01)
    assert p.stat().st_size > size0, "the background thread should flush within the interval"
    j.close()


def test_background_thread_seals_an_idle_journal(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, seal_every=10**6, seal_interval_s=0.05, flush_interval_s=0.02)
    j.append(step(0))  # seq 2 (run_opened 0, its seal 1): sealed by the thread, nobody else touches the journal
    deadline = time.time() + 30  # a loaded machine may take long; only a thread that never seals fails
    while (verify(p, keys=[pubkey], allow_unsealed=True).last_sealed_seq or 0) < 2 and time.time() < deadline:
        time.sleep(0.02)  # (not "no unsealed events": that also holds before the step's line reached the file)
    r = verify(p, keys=[pubkey])
    assert r.last_sealed_seq >= 2 and r.unsealed_events == 0
    j.close()


def test_closed_journal_refuses_appends_and_reopening(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    j.close()
    with pytest.raises(JournalClosed):
        j.append(step(0))
    with pytest.raises(JournalClosed, match="was closed"):
        Journal.open_append(p, signer=signer)


def test_exception_in_context_leaves_run_resumable(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    with pytest.raises(RuntimeError):
        with Journal.create(p, signer=signer, background=False) as j:
            j.append(step(0))
            raise RuntimeError("loss went to the moon")
    r = verify(p, keys=[pubkey])
    assert r.tail == "open" and r.unsealed_events == 0
    with Journal.open_append(p, signer=signer, background=False) as j:
        j.append(RunResumed(reason="restart after exception"))
        j.append(step(1))
    r = verify(p, keys=[pubkey], require_closed=True)
    assert r.kinds["run_resumed"] == 1 and r.kinds["step_observed"] == 2


def test_second_writer_in_same_process_is_refused(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False):
        with pytest.raises(JournalLocked, match="another writer"):
            Journal.open_append(p, signer=signer)


def test_second_writer_in_another_process_is_refused(tmp_path, keypair):
    signer, priv, _ = keypair
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False):
        code = (
            "import sys\n"
            "from journal import Journal, load_signer, JournalLocked\n"
            f"try:\n    Journal.open_append({str(p)!r}, signer=load_signer({str(priv)!r}))\n"
            "except JournalLocked as e:\n    print('LOCKED', e); sys.exit(3)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 3 and "another writer" in out.stdout


def test_open_append_needs_the_same_key(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).suspend()
    with pytest.raises(Exception, match="not pinned|signed by key"):
        Journal.open_append(p, signer=Signer.generate())
    with pytest.raises(UsageError, match="needs that signer"):
        Journal.open_append(p, signer=None)


def test_open_append_repairs_a_torn_tail(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    for i in range(20):
        j.append(step(i))
    j.suspend()
    full = p.read_bytes()
    torn = b'{"kind":"step_observed","step":20,"loss":1.'
    p.write_bytes(full + torn)
    assert verify(p, keys=[pubkey]).tail == "torn"
    with Journal.open_append(p, signer=signer, background=False) as j:
        j.append(step(20))
    r = verify(p, keys=[pubkey], require_closed=True)
    assert r.kinds["tail_repaired"] == 1
    repaired = [e for e in read_events(p) if type(e).__struct_config__.tag == "tail_repaired"][0]
    assert repaired.offset == len(full) and repaired.length == len(torn)
    side = p.with_name(repaired.sidecar)
    assert side.read_bytes() == torn  # moved aside, never deleted


def test_threads_append_concurrently(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    n_threads, per = 4, 500
    with Journal.create(p, signer=signer, seal_every=50, flush_interval_s=0.01) as j:
        def work(t):
            for i in range(per):
                j.append(step(t * per + i))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    r = verify(p, keys=[pubkey], require_closed=True)
    assert r.kinds["step_observed"] == n_threads * per
    steps = sorted(e.step for e in read_events(p) if type(e).__struct_config__.tag == "step_observed")
    assert steps == list(range(n_threads * per))


def test_unsigned_journal_round_trip(tmp_path):
    p = tmp_path / "u.jsonl"
    with Journal.create(p) as j:
        j.append(step(0))
    assert verify(p, allow_unsigned=True, require_closed=True).trust == "unsigned"


def test_journal_file_is_not_world_writable(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).close()
    assert not os.stat(p).st_mode & 0o022


@pytest.mark.parametrize("event", [RunClosed(status="completed"),
                                   Seal(sealed_seq=0, sealed_hash="0" * 64, key_id=None, sig=None)])
def test_writer_owned_kinds_cannot_be_appended(tmp_path, signer, event):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False) as j:
        with pytest.raises(UsageError, match="written by the journal itself"):
            j.append(event)


def test_deferred_appends_keep_order_and_seal_policy(tmp_path, signer, pubkey):
    """The monitor's deferred path: mixed with ordinary appends, every event lands in order, NaN spelled
    exactly, a seal every seal_every events, and the journal verifies like any other."""
    import math

    from trainledger.journal import read_events

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, seal_every=100, seal_interval_s=3600, background=False) as j:
        for i in range(250):
            ev = step(i, loss=math.nan if i == 7 else 1.0)
            if i % 10 == 3:
                j.append(ev)
            else:
                j.append_deferred(ev)
    steps = [e for e in read_events(p) if type(e).__struct_config__.tag == "step_observed"]
    assert [e.step for e in steps] == list(range(250)) and math.isnan(steps[7].loss)
    r = verify(p, keys=[pubkey], require_closed=True)
    assert r.kinds["seal"] >= 3 and r.unsealed_events == 0


class _CountingEvent(threading.Event):
    """The writer thread's stop event, recording the timeout of each of the thread's waits (one per wake-up)."""

    def __init__(self):
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        return super().wait(timeout)


def test_an_idle_journal_wakes_its_thread_once_a_flush_interval(tmp_path, signer):
    """Counted, not timed: every wait of an idle journal's thread asks for a whole flush interval (a thread that
    spins, with a due time left in the past, asks for none), and it waits at most once an interval. A loaded
    machine can only make it wake less often."""
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, flush_interval_s=0.05)
    j.append(step(0))
    j.seal(durable=True)  # the step is written and sealed: nothing is due any more
    j._ticker.kick = ev = _CountingEvent()  # the thread waits on it (a signature coming back wakes it early), every turn
    t0 = time.monotonic()
    while len(ev.timeouts) < 5 and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    j.close()
    timeouts = ev.timeouts[:5]
    assert len(timeouts) == 5, "the idle thread never woke"
    assert all(t is not None and 0.04 <= t <= 0.052 for t in timeouts), timeouts  # an interval (+1 ms of slack)
    assert len(ev.timeouts) <= elapsed / 0.04 + 2, (len(ev.timeouts), elapsed)


def test_the_thread_wakes_when_a_seal_is_due_not_only_each_flush_interval(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, seal_every=10**6, seal_interval_s=0.1, flush_interval_s=60)
    time.sleep(0.15)  # the next seal is due; the thread sleeps until then, at most a flush interval
    j.append_deferred(step(0))
    deadline = time.monotonic() + 30  # half the flush interval: only the seal's own due time can bring it so soon
    while verify(p, keys=[pubkey]).last_sealed_seq < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    r = verify(p, keys=[pubkey])  # run_opened 0, its seal 1, the step 2 under a seal
    assert r.last_sealed_seq == 2 and r.unsealed_events == 0 and r.tail == "open"
    j.close()


def test_deferred_appends_reach_the_os_within_the_flush_interval(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, flush_interval_s=0.05)
    j.append_deferred(step(0))
    deadline = time.monotonic() + 5
    while b'"step":0' not in p.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b'"step":0' in p.read_bytes()  # written by the background thread, nobody else touched the journal
    j.close()


def test_append_later_makes_its_event_at_the_drain_in_order_with_the_call_time(tmp_path, signer, pubkey):
    """append_later: the event is made by the drain (not at the call), lands in call order between deferred and
    ordinary appends, with the time of the call; a build that gives None writes nothing, one that raises costs
    its own line only."""
    import math

    p = tmp_path / "j.jsonl"
    made = []

    def build(i):
        made.append(i)
        if i == 5:
            return None
        if i == 7:
            raise RuntimeError("broken build")
        return step(i, loss=math.inf if i == 2 else 1.0)

    with Journal.create(p, signer=signer, seal_every=1000, background=False) as j:
        for i in range(10):
            if i == 3:
                j.append(step(i))
            elif i % 2:
                j.append_later(build, i)
            else:
                j.append_deferred(step(i))
            if i == 1:
                t_call = time.time_ns()
                time.sleep(0.02)  # the drain comes later: the line keeps its call's time
        assert made == [1]  # the ordinary append at 3 drained the queue; nothing else is made until a drain
        j.drain()
        assert made == [1, 5, 7, 9]
    lines = [x for x in map(parse, read_lines(p)) if x.get("kind") == "step_observed"]
    assert [x["step"] for x in lines] == [0, 1, 2, 3, 4, 6, 8, 9]
    assert lines[1]["ts"] <= t_call < lines[2]["ts"] - 10_000_000
    assert verify(p, keys=[pubkey], require_closed=True).ok


def test_a_deferred_append_that_races_a_close_is_refused_never_lost(tmp_path, signer, pubkey, monkeypatch):
    """The deferred queue takes no lock: a close on another thread may come between an append's check and its
    queueing. That interleaving is forced here (the close runs inside the append's clock read): the append raises
    JournalClosed; it is never left in a queue no drain will take."""
    from trainledger.journal import writer

    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    j.append_deferred(step(0))
    real_now, closing = writer._now, []

    def now():
        if not closing:
            closing.append(1)
            j.close()  # what another thread's close does between the check and the append
        return real_now()

    monkeypatch.setattr(writer, "_now", now)
    with pytest.raises(JournalClosed):
        j.append_deferred(step(1))
    monkeypatch.setattr(writer, "_now", real_now)
    assert [e.step for e in read_events(p) if type(e).__struct_config__.tag == "step_observed"] == [0]
    assert verify(p, keys=[pubkey], require_closed=True).ok and not j._pending
