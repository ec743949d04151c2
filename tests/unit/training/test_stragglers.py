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
