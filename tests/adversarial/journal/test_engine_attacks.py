"""Trust round 3, the engine: someone who runs a Ray cluster on the machine (or whose workers a driver joins) holds
no key. ``verify RUN_DIR --ray`` with no address starts a private cluster for the call, never joining one that is
already there (``RAY_ADDRESS``, the last ``ray start``); and whatever a task returns is held to the caller's policy
before the run's check rests on it (a journal under an unpinned key, or another rank's, never passes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from trainledger.journal import Signer, StepObserved, TrustPolicy, verify  # noqa: E402
from trainledger.journal.roster import Roster, RosterMismatch  # noqa: E402
from trainledger.journal.backends.ray import _hold_report  # noqa: E402
from trainledger.journal.errors import IntegrityError  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal  # noqa: E402


def _ranks(d, signers):
    for r, s in enumerate(signers):
        info = RankInfo(run="eng", rank=r, world_size=len(signers), local_rank=0, node="n", restart_count=0)
        with open_rank_journal(d, s, info=info) as j:
            for i in range(3):
                j.append(StepObserved(step=i, loss=1.0))
    return d


def test_verify_ray_without_an_address_never_joins_the_cluster_the_environment_names(tmp_path, signer, keypair):
    d = _ranks(tmp_path / "run", [signer, signer])
    # RAY_ADDRESS names a cluster (here: nothing listens there); Ray's address=None would join it
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    p = subprocess.run([sys.executable, "-m", "trainledger", "verify", str(d), "--ray", "--pubkey", str(keypair[2])],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ranks verified on a private local Ray cluster started for the call" in p.stdout


def test_a_tasks_report_under_an_unpinned_key_or_of_another_rank_is_not_taken(tmp_path, signer):
    mallory = Signer.generate()
    d = _ranks(tmp_path / "run", [signer, mallory])
    policy = TrustPolicy(keys=(signer.public,))
    _hold_report(0, verify(d / "rank-00000.jsonl", trust=policy), policy, "rank 0")
    # what a worker of someone else's cluster could return: rank 1 checked against its own embedded key
    theirs = verify(d / "rank-00001.jsonl", trust_embedded=True)
    with pytest.raises(IntegrityError, match="rank 1: its task reports trust 'embedded' under key .* not a pinned"):
        _hold_report(1, theirs, policy, "rank 1")
    # or rank 0's sound report handed back as rank 1's
    with pytest.raises(IntegrityError, match="rank 1: its task reports run 'eng.r00000', not a rank-1"):
        _hold_report(1, verify(d / "rank-00000.jsonl", trust=policy), policy, "rank 1")
    with pytest.raises(IntegrityError, match="not a verification report"):
        _hold_report(0, {"ok": True}, policy, "rank 0")
    # with a roster pinned, each rank's report must be under that rank's key
    both = TrustPolicy(roster=Roster(ranges=((0, 0, signer.key_id), (1, 1, mallory.key_id)),
                                     keys=(signer.public, mallory.public)))
    _hold_report(1, verify(d / "rank-00001.jsonl", trust=both), both, "rank 1")
    with pytest.raises(RosterMismatch, match="rank 0: its task reports a journal signed by"):
        swapped = TrustPolicy(roster=Roster(ranges=((0, 0, mallory.key_id), (1, 1, signer.key_id)),
                                            keys=(signer.public, mallory.public)))
        _hold_report(0, verify(d / "rank-00000.jsonl", trust=both), swapped, "rank 0")
