"""Runs across ranks: one journal per rank, cross-rank anchors, sharded checkpoints (``ranks``), the
straggler fold (``stragglers``, torch-free), the replicas' state held to each other (``state_watch``; its fold,
``sdc``, torch-free) and the DDP reference loop (``loop``).

The pieces a torchrun script needs import from here, as 0.1.0 documented them::

    from trainledger.training.distributed import (ShardedCheckpointer, StragglerDetector, anchor_ranks,
                                                  init_process_group, open_rank_journal, rank_key, restore_sharded)

They resolve on first use (PEP 562), so ``trainledger.training.distributed.stragglers`` imports without torch.
"""

_RANKS = ("RankInfo", "rank_info", "open_rank_journal", "anchor_ranks", "anchor_record", "rank_journal_name",
          "in_torchrun", "journal_name", "init_process_group", "StragglerDetector", "ComputeClock", "save_sharded",
          "restore_sharded", "ShardedCheckpointer", "ShardedRestore", "rank_key")


#: silent data corruption (docs/sdc.md): the replicas' state fingerprints held to each other while they train
_STATE = ("StateWatch", "StateDivergence", "ReplayCheck", "ReplayMismatch")


def __getattr__(name: str):
    if name in _RANKS:
        from trainledger.training.distributed import ranks

        return getattr(ranks, name)
    if name in _STATE:
        from trainledger.training.distributed import state_watch

        return getattr(state_watch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_RANKS) + list(_STATE)
