"""A node lost while a run folder is verified on Ray: a real two-node local cluster (``ray.cluster_utils``), the
node running a rank's task removed mid-run and another added; Ray runs the lost task again and the verdict still
covers every rank, as ``verify RUN_DIR`` gives it. Also ``export parquet --ray`` on the same cluster writes the
files a local export writes, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from ray.cluster_utils import Cluster  # noqa: E402

from trainledger.journal import Signer, StepObserved  # noqa: E402
from trainledger.journal.audit.rundir import verify_run_dir  # noqa: E402
from trainledger.journal.backends.ray import verify_run_dir_ray  # noqa: E402
from trainledger.journal.views.parquet import LISTING, export_parquet  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal  # noqa: E402

#: node death noticed within about a second (Ray's default health check takes some 30 s)
_FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 200,
                "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("loss") / "run"
    s = Signer.generate()
    for r in range(4):
        j = open_rank_journal(d, s, info=RankInfo(run="lossy", rank=r, world_size=4, local_rank=0, node=f"n{r}",
                                                  restart_count=0))
        for i in range(25_000):
            j.append(StepObserved(step=i, loss=2.0 + (i % 7) / 100, grad_norm=0.5, step_time_s=0.1))
        j.close()
    return d, s


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": _FAST_HEALTH})
    first = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield c, first
    ray.shutdown()
    c.shutdown()


def _reading(d) -> bool:
    """Whether some process other than this one has a file of ``d`` open (a task verifying a rank journal)."""
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(d) + "/"):
                    return True
        except OSError:  # gone, or not ours to look at
            continue
    return False


def test_a_node_lost_mid_run_still_gives_a_verdict_on_every_rank(run, cluster):
    d, s = run
    c, first = cluster
    want = verify_run_dir(d, keys=[s.public]).to_dict()
    got: dict = {}

    def call():
        try:
            got["report"] = verify_run_dir_ray(d, keys=[s.public]).to_dict()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            got["error"] = e

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 60
    while not _reading(d):
        assert time.monotonic() < deadline and t.is_alive(), "no task ever opened a rank journal"
    c.remove_node(first)  # while a task on it is reading a rank journal: that task is lost mid-run
    c.add_node(num_cpus=1)
    t.join(120)
    assert not t.is_alive()
    assert "error" not in got, got.get("error")
    assert got["report"].pop("engine") == "the Ray cluster this process had joined"
    assert got["report"] == want and len(got["report"]["ranks"]) == 4


def test_export_on_ray_writes_what_a_local_export_writes(run, cluster, tmp_path):
    d, s = run
    here = export_parquet([d], tmp_path / "here", lines=True, keys=[s.public])
    there = export_parquet([d], tmp_path / "there", lines=True, keys=[s.public], ray=True)
    assert (there.journals, there.events, there.files) == (here.journals, here.events, here.files) == \
        (4, here.events, here.files)
    a, b = (json.loads((tmp_path / x / LISTING).read_text()) for x in ("here", "there"))
    assert a == b
    for f in a["files"]:
        assert hashlib.sha256((tmp_path / "there" / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    assert not list(tmp_path.glob(".*partial*"))
