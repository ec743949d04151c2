"""``verify RUN_DIR --ray``: every rank journal verified as a task of a real local Ray cluster, the anchors and
the run's identity checked by the same code ``verify RUN_DIR`` runs. It must say what ``verify RUN_DIR`` says: the
same report for a sound folder, and for a changed byte, a missing rank and a rank of another run the same failure
naming the rank. One local Ray (two CPUs) serves the module."""

from __future__ import annotations

import shutil

import pytest

ray = pytest.importorskip("ray")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import Signer, StepObserved, TrustPolicy  # noqa: E402
from trainledger.journal.audit.rundir import verify_run_dir  # noqa: E402
from trainledger.journal.backends.ray import verify_run_dir_ray  # noqa: E402
from trainledger.journal.errors import UsageError  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, anchor_record, open_rank_journal  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _folder(d, signer, world=8, run="rayrun", steps=40):
    js = [open_rank_journal(d, signer, info=RankInfo(run=run, rank=r, world_size=world, local_rank=0,
                                                     node=f"node-{r // 4}", restart_count=0)) for r in range(world)]
    for k in range(2):
        for j in js:
            for i in range(steps):
                j.append(StepObserved(step=steps * k + i, loss=2.0 + i / 100, grad_norm=0.5, step_time_s=0.2))
            j.seal()
        got = [("%d:%s" % j.head, j.key_id) for j in js]
        for r, j in enumerate(js):
            j.append(anchor_record(r, got, step=steps * k + steps - 1))
    for j in js:
        j.close()
    return d


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    s = Signer.generate()
    return _folder(tmp_path_factory.mktemp("ray") / "run", s), s


def test_ray_says_what_verify_run_dir_says(folder):
    d, s = folder
    here = verify_run_dir(d, keys=[s.public])
    there = verify_run_dir_ray(d, keys=[s.public])
    assert there.engine == "the Ray cluster this process had joined" and here.engine is None
    there.engine = None
    assert there.to_dict() == here.to_dict()
    assert len(there.ranks) == 8 and there.anchors == here.anchors > 0


def test_a_changed_byte_a_missing_rank_and_a_foreign_rank_fail_naming_the_rank(folder, tmp_path, capsys):
    d, s = folder
    bad = tmp_path / "byte"
    shutil.copytree(d, bad)
    f = bad / "rank-00005.jsonl"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    assert main(["verify", str(bad), "--ray", "--pubkey", _pub(tmp_path, s)]) == 1
    assert "rank 5:" in capsys.readouterr().out
    gone = tmp_path / "gone"
    shutil.copytree(d, gone)
    (gone / "rank-00003.jsonl").unlink()
    assert main(["verify", str(gone), "--ray", "--pubkey", _pub(tmp_path, s)]) == 1
    out = capsys.readouterr().out
    assert "rank 3" in out and "FAIL" in out
    other = _folder(tmp_path / "other", s, run="another")
    foreign = tmp_path / "foreign"
    shutil.copytree(d, foreign)
    shutil.copy(other / "rank-00002.jsonl", foreign / "rank-00002.jsonl")
    with pytest.raises(Exception, match="rank 2"):
        verify_run_dir_ray(foreign, keys=[s.public])
    with pytest.raises(Exception, match="rank 2") as e_here:
        verify_run_dir(foreign, keys=[s.public])
    with pytest.raises(type(e_here.value)):
        verify_run_dir_ray(foreign, keys=[s.public])


def test_tasks_take_pinned_keys_only(folder):
    d, s = folder
    with pytest.raises(UsageError, match="pinned keys only"):
        verify_run_dir_ray(d, trust=TrustPolicy(trust_embedded=True))


def _pub(tmp_path, s):
    p = tmp_path / "k.pub"
    p.write_text(s.public.line() + "\n")
    return str(p)
