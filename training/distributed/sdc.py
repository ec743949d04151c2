"""Silent data corruption, as a fold over every rank's signed state fingerprints (torch-free, so replay recomputes
it; docs/sdc.md).

Data-parallel replicas hold bit-identical state after every optimizer step: the same initial weights, the same
averaged gradient, the same update. So their ``state_fingerprinted`` roots for a step must be equal, and any two
that differ mean that a replica's state changed by something other than training: a flipped bit in its memory, a
faulty unit that computed its update wrong, a corrupted copy. :func:`diverged` is the rule, the same code the live
Recorder runs on rank 0 (over the roots it gathers) and replay runs here (over the ranks' journals):

- the step's roots are grouped; a root held by a strict majority of the replicas is the majority, and the ranks
  outside it are named (3 or more replicas: the one whose bits changed); without a strict majority (two replicas,
  or an even split) every rank of the step is named, as no vote can tell which is right;
- the tensor: the first whose pair (``digests``) differs between a named rank and a majority rank (or, without a
  majority, the other rank), in the named rank's order; None where the digests were not recorded;
- a rank is named once an episode, at the first step it left the majority: its state stays diverged until it is
  repaired (a rewind to a checkpoint the ranks agree on), and the later steps add nothing; once every replica
  agrees again the episode is over. A torchrun restart starts a new round, and its own episodes.

Where the state is sharded (FSDP2, HSDP), each rank's fingerprint is of its own shards and states which ranks
hold the same ones (``replicas``): the rule runs within each such set (:func:`diverged_within`), and a rank that
no other rank replicates is compared with nobody.

It cannot raise a false alarm on replicas that are meant to be identical: equal bits give equal roots. State that
replicas hold differently on purpose (a per-rank RNG, a non-replicated buffer) must be left out when
fingerprinting (``excluded``, recorded, the same on every rank); a rank that left out other tensors than its peers
has another root and is named like any other.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["diverged", "diverged_within", "replica_sets", "audit_state"]


def diverged(roots: dict[int, str], digests: dict[int, dict[str, str] | None],
             named: set[int]) -> dict[str, Any] | None:
    """The rule for one step: ``roots`` rank -> root, ``digests`` rank -> its digests (or None), ``named`` the ranks
    already named in this episode (updated; emptied when the roots agree). Returns the ``state_diverged`` fields
    (``rank``, ``ranks``, ``replicas``, ``tensor``, ``majority``) or None when the roots agree or every rank outside
    the majority was named before."""
    if len(set(roots.values())) <= 1:
        named.clear()
        return None
    (top, count), = Counter(roots.values()).most_common(1)
    majority = top if count * 2 > len(roots) else None
    out = sorted(r for r, root in roots.items() if majority is None or root != majority)
    new = [r for r in out if r not in named]
    if not new:
        return None
    named.update(new)
    first = new[0]
    if majority is not None:
        ref = min(r for r, root in roots.items() if root == majority)
    else:
        ref = min(r for r in roots if roots[r] != roots[first])
    return {"rank": first, "ranks": new, "replicas": len(roots),
            "tensor": _first_tensor(digests.get(first), digests.get(ref)), "majority": majority}


def replica_sets(stated: dict[int, list[int] | None]) -> list[list[int]]:
    """A step's ranks partitioned by the replica group each stated (``state_fingerprinted.replicas``; None: every
    rank of the run): the ranks stating the same group are held to each other, in order of their lowest rank."""
    sets: dict[Any, list[int]] = {}
    for r in sorted(stated):
        g = stated[r]
        sets.setdefault(None if g is None else tuple(sorted(g)), []).append(r)
    return sorted(sets.values())


def diverged_within(roots: dict[int, str], digests: dict[int, dict[str, str] | None],
                    stated: dict[int, list[int] | None], named: dict[Any, set[int]]) -> list[dict[str, Any]]:
    """:func:`diverged` within each set of :func:`replica_sets` (``named``: each set's episode, by its ranks);
    the verdicts, in order of their sets."""
    out = []
    for ranks in replica_sets(stated):
        d = diverged({r: roots[r] for r in ranks}, {r: digests.get(r) for r in ranks},
                     named.setdefault(tuple(ranks), set()))
        if d is not None:
            out.append(d)
    return out


def _first_tensor(mine: dict[str, str] | None, theirs: dict[str, str] | None) -> str | None:
    if mine is None or theirs is None:
        return None
    for name, d in mine.items():
        if theirs.get(name) != d:
            return name
    for name in theirs:
        if name not in mine:
            return name
    return None


def audit_state(rank_events: dict[int, list[Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Recompute every divergence from every rank's ``state_fingerprinted`` and hold rank 0's ``state_diverged``
    records to them (each rank's ``replay_checked`` verdicts are held to their own fields by its journal's replay:
    ``training.audit.ReplayCheckAudit``), and every rank's ``rewind_decided`` for a state divergence to a divergence
    the fingerprints give at its step. Returns (the divergences, each {step, rank, ranks, replicas, tensor, majority, round}; the
    differences, each {seq, kind, detail}). A step is compared within the torchrun round it was fingerprinted in
    (the ``rank_joined`` before it); a step fingerprinted more than once in a round (a resume redid it) by its last
    fingerprint."""
    from trainledger.journal.kinds import RankJoined
    from trainledger.training.kinds import RewindDecided, StateDiverged, StateFingerprinted

    # round -> step -> rank -> the fingerprint; and each rank's rewinds for a state divergence, with their round
    by_round: dict[int, dict[int, dict[int, Any]]] = {}
    rewinds: list[tuple[int, Any]] = []
    for r, events in rank_events.items():
        current = 0
        for ev in events:
            if isinstance(ev, RankJoined):
                current = ev.restart_count
            elif isinstance(ev, StateFingerprinted):
                by_round.setdefault(current, {}).setdefault(ev.step, {})[r] = ev
            elif isinstance(ev, RewindDecided) and ev.anomaly == "state_diverged":
                rewinds.append((current, ev))
    found: list[dict[str, Any]] = []
    sets: dict[tuple[int, int], list[list[int]]] = {}  # (round, step) -> its replica sets
    for rnd in sorted(by_round):
        named: dict[Any, set[int]] = {}
        for step in sorted(by_round[rnd]):
            fps = by_round[rnd][step]
            stated = {r: e.replicas for r, e in fps.items()}
            sets[(rnd, step)] = replica_sets(stated)
            for d in diverged_within({r: e.root for r, e in fps.items()}, {r: e.digests for r, e in fps.items()},
                                     stated, named):
                found.append({"step": step, **d, "round": rnd})
    # rank 0's records, in its rounds, against what the fingerprints give
    recorded: list[tuple[int, Any]] = []
    current = 0
    for ev in rank_events.get(0, []):
        if isinstance(ev, RankJoined):
            current = ev.restart_count
        elif isinstance(ev, StateDiverged):
            recorded.append((current, ev))
    differences: list[dict[str, Any]] = []
    def set_of(rnd: int, step: int, rank: int) -> tuple[int, ...]:
        """The replica set of ``rank`` at that step: what a verdict is keyed by (a record naming another rank of
        the same set is a wrong record, not a missing one)."""
        ranks = next((s for s in sets.get((rnd, step), []) if rank in s), None)
        return tuple(ranks) if ranks is not None else (rank,)

    expected = {(d["round"], d["step"], set_of(d["round"], d["step"], d["rank"])): d for d in found}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for rnd, ev in recorded:
        key = (rnd, ev.step, set_of(rnd, ev.step, ev.rank))
        d = expected.get(key)
        got = {"rank": ev.rank, "ranks": list(ev.ranks), "replicas": ev.replicas, "tensor": ev.tensor,
               "majority": ev.majority}
        if d is None:
            differences.append({"seq": getattr(ev, "seq", None), "kind": "state_diverged",
                                "detail": f"step {ev.step}: recorded ranks {ev.ranks} diverged, which the ranks' "
                                          "fingerprints do not give"})
        elif {k: d[k] for k in got} != got:
            differences.append({"seq": getattr(ev, "seq", None), "kind": "state_diverged",
                                "detail": f"step {ev.step}: recorded {got}, the fingerprints give "
                                          f"{ {k: d[k] for k in got} }"})
        seen.add(key)
    later = {rnd: max(steps) for rnd, steps in
             ((rnd, [s for s, fps in by_round[rnd].items() if 0 in fps]) for rnd in by_round) if steps}
    for key, d in expected.items():
        # rank 0 went on fingerprinting after the step in that round: it had the roots and did not record it
        if key not in seen and later.get(key[0], -1) > key[1]:
            differences.append({"seq": None, "kind": "state_diverged",
                                "detail": f"step {d['step']}: ranks {d['ranks']} diverged (tensor {d['tensor']}), "
                                          "and rank 0 recorded no state_diverged"})
    # a rewind for a state divergence rests on one the fingerprints give, at its step, in its round
    at = {(d["round"], d["step"]) for d in found}
    for rnd, ev in rewinds:
        if (rnd, ev.spike_step) not in at:
            differences.append({"seq": getattr(ev, "seq", None), "kind": "rewind_decided",
                                "detail": f"a rewind for a state divergence at step {ev.spike_step}, which the ranks' "
                                          "fingerprints do not give"})
    return found, differences
