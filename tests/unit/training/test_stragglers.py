"""The straggler detector's last, partial window (a one-process gloo group: the collective is real, the world 1)."""

from __future__ import annotations

import torch.distributed as dist

from trainledger.journal import Journal, read_events
from trainledger.training.distributed.ranks import StragglerDetector


def test_finish_scores_the_last_partial_window_and_nothing_when_there_is_none(tmp_path, signer):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with Journal.create(tmp_path / "j.jsonl", signer=signer) as j:
            det = StragglerDetector(j, every=5)
            for step in range(12):
                det.observe(step, 0.01)
            assert det.finish() == {0: 1.0}  # steps 10 and 11: scored, not dropped
            assert det.finish() == {}  # nothing left
        windows = [(e.window_start, e.window_end) for e in read_events(tmp_path / "j.jsonl")
                   if type(e).__struct_config__.tag == "straggler_scores"]
        assert windows == [(0, 4), (5, 9), (10, 11)]
    finally:
        dist.destroy_process_group()



_SLOWDOWNS = (1.3, 1.2, 1.0)


def _two_ranks(rank: int, tmp: str) -> None:
    from trainledger.journal import load_signer

    store = dist.FileStore(f"{tmp}/store2", 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        signer = load_signer(f"{tmp}/keys/trainledger.key")
        for x in _SLOWDOWNS:  # rank 1's time is x times rank 0's
            with Journal.create(f"{tmp}/{x}-rank-{rank}.jsonl", signer=signer) as j:
                det = StragglerDetector(j, every=10, threshold=0.8)
                for step in range(20):
                    det.observe(step, 0.1 * (x if rank else 1.0) * (1 + 0.01 * (step % 3)))  # the same jitter
    finally:
        dist.destroy_process_group()


def test_a_rank_whose_compute_takes_1_3x_is_flagged_at_the_recorders_threshold(tmp_path):
    """Two real gloo ranks with their step times given (not measured, so the verdict cannot depend on the machine's
    load): at the Recorder's threshold of 0.8 a rank taking 1.3x its peer's time scores 0.77 and is flagged in every
    window; 1.2x (0.83) and equal ranks are not. The integration tests time real compute, with wider margins."""
    import inspect

    import torch.multiprocessing as mp

    from trainledger.journal import keygen
    from trainledger.training import Recorder

    assert inspect.signature(Recorder).parameters["straggler_threshold"].default == 0.8
    keygen(tmp_path / "keys")
    mp.spawn(_two_ranks, args=(str(tmp_path),), nprocs=2, join=True)
    for x in _SLOWDOWNS:
        evs = list(read_events(tmp_path / f"{x}-rank-0.jsonl"))
        scores = [round(e.scores["1"], 3) for e in evs if type(e).__struct_config__.tag == "straggler_scores"]
        flagged = [(e.rank, e.window_start) for e in evs if type(e).__struct_config__.tag == "straggler_detected"]
        assert scores == [round(1 / x, 3)] * 2, (x, scores)
        assert flagged == ([(1, 0), (1, 10)] if x == 1.3 else []), (x, flagged)
