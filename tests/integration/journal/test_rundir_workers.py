"""verify_run_dir with shared workers: every rank's ranges go to one pool of processes while the ranks are checked
side by side (a thread each). Forced on for small journals by lowering the size threshold (the forked workers
inherit it); the answers must be those of the one-process path, and the first failing rank in rank order is the
one named."""

from __future__ import annotations

import importlib

import pytest
from journal_tools import read_lines, write_lines

from trainledger.journal import IntegrityError, Journal, StepObserved
from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored
from trainledger.journal.audit.rundir import verify_run_dir

verify_mod = importlib.import_module("trainledger.journal.verify")


def _run_dir(d, signer, ranks=3, rounds=4, steps=300, **journal_options):
    js = [Journal.create(d / f"rank-{r:05d}.jsonl", signer=signer, run_id=f"t.r{r:05d}", **journal_options)
          for r in range(ranks)]
    for r, j in enumerate(js):
        j.append(RankJoined(run="t", rank=r, world_size=ranks, local_rank=r, node="n"))
    for k in range(rounds):
        for j in js:
            for s in range(k * steps, (k + 1) * steps):
                j.append(StepObserved(step=s, loss=3.0 - s * 1e-3, grad_norm=1.0, lr=1e-3, step_time_s=0.1))
        heads = {}
        for r, j in enumerate(js):
            j.seal()
            heads[r] = "%d:%s" % j.head
        js[0].append(RanksAnchored(heads={str(r): x for r, x in heads.items()}, step=k))
        for j in js[1:]:
            j.append(AnchorRecorded(rank=0, head=heads[0], step=k))
    for j in js:
        j.close()
    return d


@pytest.fixture
def shared_workers(monkeypatch):
    monkeypatch.setattr(verify_mod, "PARALLEL_MIN_BYTES", 0)
    started = []
    real = verify_mod.SharedWorkers.__enter__

    def enter(self):
        out = real(self)
        started.append(self.pool is not None)
        return out

    monkeypatch.setattr(verify_mod.SharedWorkers, "__enter__", enter)
    return started


def test_shared_workers_give_the_one_process_answers(tmp_path, signer, pubkey, shared_workers):
    run = _run_dir(tmp_path, signer)
    one = verify_run_dir(run, keys=[pubkey], workers=1)
    assert shared_workers and not any(shared_workers)  # one process: the folder's and each journal's, no workers
    shared_workers.clear()
    many = verify_run_dir(run, keys=[pubkey], workers=2)
    assert shared_workers == [True]  # one pool for the folder, which every journal's ranges went to
    assert many.anchors == one.anchors == 4 * (2 + 2)  # each round: rank 0 anchors 2 ranks, 2 ranks anchor rank 0
    for r in range(3):
        a, b = one.ranks[r], many.ranks[r]
        assert (a.events, a.last_hash, a.seals, a.kinds, a.tail) == (b.events, b.last_hash, b.seals, b.kinds, b.tail)
        assert a.tree.root() == b.tree.root()


def test_shared_workers_name_the_first_failing_rank(tmp_path, signer, pubkey, shared_workers):
    run = _run_dir(tmp_path, signer)
    for r in (1, 2):  # both ranks broken: a byte flipped in a step line
        p = run / f"rank-{r:05d}.jsonl"
        lines = read_lines(p)
        i = next(i for i, x in enumerate(lines) if b'"step":100,' in x)
        lines[i] = lines[i].replace(b'"loss":', b'"loss":1', 1)
        write_lines(p, lines)
    with pytest.raises(IntegrityError) as ei:
        verify_run_dir(run, keys=[pubkey], workers=2)
    assert shared_workers == [True]
    assert str(ei.value).startswith("rank 1:")


def test_ctrl_c_stops_a_shared_verification_at_once(tmp_path, signer, pubkey, shared_workers, monkeypatch):
    """A rank whose ranges never come back (a worker blocked for good: here one opening a FIFO no one writes) does
    not hold the folder's verification once Ctrl-C arrives: the waiting threads stop, the workers are stopped."""
    import faulthandler
    import os
    import signal
    import time

    from trainledger.journal.audit import rundir
    from trainledger.journal.scan import ScanContext

    (tmp_path / "run").mkdir()
    run = _run_dir(tmp_path / "run", signer, ranks=2, rounds=1, steps=10)
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    real = rundir._verify_rank

    def stuck(rank, f, trust, want=frozenset(), *, workers=None, _pool=None):
        if rank == 0:
            _pool.run([(str(fifo), 0, 10, -1, bytes(32), ScanContext("r", None, None, False, None), True)])
        return real(rank, f, trust, want, workers=workers, _pool=_pool)

    def interrupt(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir, "_verify_rank", stuck)
    old = signal.signal(signal.SIGALRM, interrupt)
    faulthandler.dump_traceback_later(60, exit=True)  # the bug this guards against is a hang: fail, do not hang
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)  # Ctrl-C, half a second in (a timer, not a thread: no fork then)
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            verify_run_dir(run, keys=[pubkey], workers=2)
        assert time.monotonic() - t < 30  # stopped, not run to the end (the hang itself: faulthandler)
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        _release(fifo)
    assert shared_workers == [True]


def test_shared_workers_beside_another_thread_come_from_a_fork_server(tmp_path, signer, pubkey):
    """Forking beside a live thread can deadlock the child (a lock the thread held is copied locked): the workers
    then come from a fork server, which never had that thread, and they check the ranges as forked ones do."""
    import threading

    from trainledger.journal.verify import SharedWorkers

    run = _run_dir(tmp_path, signer)
    one = verify_run_dir(run, keys=[pubkey], workers=1)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with SharedWorkers(2, total_bytes=1 << 40) as shared:
            assert shared.pool is not None and shared.pool._ctx.get_start_method() == "forkserver"
        verify_mod.PARALLEL_MIN_BYTES, saved = 0, verify_mod.PARALLEL_MIN_BYTES
        try:
            both = verify_run_dir(run, keys=[pubkey], workers=2)
        finally:
            verify_mod.PARALLEL_MIN_BYTES = saved
    finally:
        stop.set()
        t.join()
    assert {r: (x.last_seq, x.last_hash) for r, x in both.ranks.items()} == \
        {r: (x.last_seq, x.last_hash) for r, x in one.ranks.items()}
    with SharedWorkers(2, total_bytes=0) as shared:
        assert shared.pool is None  # small journals: not worth a fork


def test_a_fork_that_fails_is_checked_in_one_process_not_an_error(tmp_path, signer, pubkey, shared_workers,
                                                                   monkeypatch):
    """No process to spare (fork's EAGAIN or ENOMEM, as a loaded machine gives): the workers are not started and
    every journal is checked in this process, with the same answers; the command does not fail for it."""
    import errno
    import multiprocessing.context

    run = _run_dir(tmp_path, signer)
    one = verify_run_dir(run, keys=[pubkey], workers=1)
    shared_workers.clear()

    def refuse(self, *a, **k):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.BaseContext, "Pool", refuse)
    many = verify_run_dir(run, keys=[pubkey], workers=2)
    assert shared_workers and not any(shared_workers)  # the folder's, then each journal's own try: none started
    assert many.anchors == one.anchors and [many.ranks[r].last_hash for r in range(3)] == \
        [one.ranks[r].last_hash for r in range(3)]


def test_a_worker_killed_mid_range_is_an_error_not_a_hang(tmp_path):
    """The OOM killer (here SIGKILL) takes a worker holding a range: the pool replaces the worker, the range never
    comes back; the verification says so instead of waiting for ever."""
    import faulthandler
    import os
    import signal

    from trainledger.journal import JournalIOError
    from trainledger.journal.scan import ScanContext
    from trainledger.journal.verify import SharedWorkers

    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        with SharedWorkers(2, total_bytes=1 << 40) as shared:
            assert shared.pool is not None
            victim = next(iter(shared._pids))
            signal.setitimer(signal.ITIMER_REAL, 0)
            old = signal.signal(signal.SIGALRM, lambda *_: os.kill(victim, signal.SIGKILL))
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            try:
                ctx = ScanContext("r", None, None, False, None)
                with pytest.raises(JournalIOError, match="died"):
                    shared.run([(str(fifo), 0, 10, -1, bytes(32), ctx, True)] * 2)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
                _release(fifo)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _release(fifo) -> None:
    """Let a worker still blocked opening the FIFO go (it then reads it empty)."""
    import os

    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader left


@pytest.mark.parametrize("cut", [0, 1, 2])
def test_block_scan_and_line_scan_hand_back_the_same_facts(tmp_path, signer, pubkey, cut, monkeypatch):
    """The verifier's block pass (feed_block) and the line-by-line pass (feed, which watch and every fallback use)
    gather the same facts from a range: counts, seals, heads, the collected anchor lines and hashes, the trees."""
    from trainledger.journal import scan as _scan
    from trainledger.journal.chain import genesis
    from trainledger.journal.merkle import CompactRange
    from trainledger.journal.reader import read_opening
    from trainledger.journal.verify import _boundaries

    monkeypatch.setattr(_scan, "BLOCK", 4096)  # many blocks, seals and anchors inside them and across them
    run = _run_dir(tmp_path, signer, ranks=2, rounds=3, steps=150, seal_every=40)
    p = run / "rank-00000.jsonl"
    size = p.stat().st_size
    opened, first_len = read_opening(p, size)
    ctx = _scan.ScanContext(opened.run_id, opened.key_id, pubkey.raw, True, None,
                            frozenset({"rank_joined", "ranks_anchored"}), frozenset({5, 77, 300}),
                            tree=_scan.TREE_CHECK, tree_at=123)
    starts = [(0, -1, genesis(opened.run_id))] + _boundaries(p, size, first_len + 1, 3)
    start, prev_seq, prev_h = starts[cut]
    end = starts[cut + 1][0] if cut + 1 < len(starts) else size

    def facts(block_mode: bool):
        res = _scan.RangeResult(start, end)
        sc = _scan.Scanner(ctx, prev_seq, prev_h, res)
        with open(p, "rb", buffering=0) as f:
            if block_mode:
                for block, off in _scan.iter_blocks(f, start, end, res, is_last=end == size):
                    sc.feed_block(block, off)
            else:
                for block, off in _scan.iter_blocks(f, start, end, res, is_last=end == size):
                    sc.feed(_scan.lines_of(block), off)
        sc.finish()
        out = {}
        for k in _scan.RangeResult.__slots__:
            v = getattr(res, k)
            if isinstance(v, CompactRange):
                v = (v.begin, v.end, v._nodes)
            elif k == "seal_roots":
                v = [(a, b, c, (t.begin, t.end, t._nodes)) for a, b, c, t in v]
            out[k] = v
        return out

    assert facts(True) == facts(False)
    got = facts(True)
    assert got["seals"] >= 3 and got["collected"] and got["count"] > 100
