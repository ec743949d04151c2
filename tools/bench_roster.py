#!/usr/bin/env python3
"""What binding every rank to its key costs ``trainledger verify RUN_DIR``: one folder of ``--ranks`` signed rank
journals (``--steps`` steps each, anchored ``--anchors`` times the way ``anchor_ranks`` records them), verified as a
whole process three ways, side by side in one run:

1. every rank signed by one key (nothing to bind);
2. one key per node of ``--per-node`` ranks, bound by rank 0's signed record (``ranks_anchored.keys``);
3. the same folder held to an operator's roster (``--roster``, one range per node, key lines that pin the keys).

Each is run ``--repeats`` times (alternated); printed: the median wall time, the process's CPU time (user + sys)
and peak RSS (``wait4``), and the machine's load average before the run.

    .venv/bin/python tools/bench_roster.py [--ranks 1024] [--per-node 8] [--steps 200] [--anchors 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def build(d: Path, signers: list, steps: int, anchors: int) -> None:
    from trainledger.journal import StepObserved
    from trainledger.training.distributed.ranks import RankInfo, anchor_record, open_rank_journal

    world = len(signers)
    js = [open_rank_journal(d, s, info=RankInfo(run="bench", rank=r, world_size=world, local_rank=0,
                                                node=f"node-{r}", restart_count=0))
          for r, s in enumerate(signers)]
    per = max(1, steps // anchors)
    for k in range(anchors):
        for j in js:
            for i in range(k * per, (k + 1) * per):
                j.append(StepObserved(step=i, loss=2.0 + 1e-3 * (i % 17), grad_norm=1.0, lr=1e-3, step_time_s=0.1))
            j.seal()
        got = [("%d:%s" % j.head, j.key_id) for j in js]
        for r, j in enumerate(js):
            j.append(anchor_record(r, got, step=(k + 1) * per - 1))
    for j in js:
        j.close()


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the process, its peak RSS bytes, the output line saying what bound the keys)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {p.returncode}: {out[-400:]}")
    lines = out.strip().splitlines()
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, next((x for x in lines if "keys bound" in x),
                                                                       lines[0])


def build_all(tmp: Path, ranks: int, per_node: int, steps: int, anchors: int) -> int:
    """Both folders, the key listings and the roster (in a child process: the verifying processes are started
    by a parent that stays small, since a child's peak RSS starts at its parent's)."""
    from trainledger.journal import Signer

    nodes = [Signer.generate() for _ in range((ranks + per_node - 1) // per_node)]
    one_key = Signer.generate()
    build(tmp / "one", [one_key] * ranks, steps, anchors)
    build(tmp / "nodes", [nodes[r // per_node] for r in range(ranks)], steps, anchors)
    (tmp / "one.pub").write_text(one_key.public.line() + "\n")
    (tmp / "nodes.pub").write_text("".join(n.public.line() + "\n" for n in nodes))
    (tmp / "roster").write_text("".join(f"{n * per_node}-{min(ranks, (n + 1) * per_node) - 1} {s.public.line()}\n"
                                        for n, s in enumerate(nodes)))
    return len(nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--anchors", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", metavar="DIR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.build:
        print(build_all(Path(a.build), a.ranks, a.per_node, a.steps, a.anchors))
        return
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        n_nodes = int(subprocess.run([sys.executable, __file__, "--build", str(tmp), "--ranks", str(a.ranks),
                                      "--per-node", str(a.per_node), "--steps", str(a.steps), "--anchors",
                                      str(a.anchors)], check=True, capture_output=True, text=True).stdout)
        built = time.perf_counter() - t0
        py = [sys.executable, "-m", "trainledger", "verify", "--require-closed"]
        cases = {
            "one key": [*py, "--pubkey", str(tmp / "one.pub"), str(tmp / "one")],
            "per-node keys, rank 0's record": [*py, str(tmp / "nodes")],
            "per-node keys, --roster": [*py, "--roster", str(tmp / "roster"), str(tmp / "nodes")],
        }
        os.environ["TRAINLEDGER_TRUSTED_KEYS"] = str(tmp / "nodes.pub")  # case 2's keys (case 3's roster pins)
        results: dict[str, list[tuple[float, float, int, str]]] = {k: [] for k in cases}
        for _ in range(a.repeats):
            for name, cmd in cases.items():
                results[name].append(timed(cmd))
        size = sum(f.stat().st_size for f in (tmp / "nodes").iterdir())
    print(f"trainledger verify RUN_DIR: {a.ranks:,} ranks ({n_nodes:,} node keys of {a.per_node} ranks), "
          f"{a.steps} steps and {a.anchors} anchors a rank, {size / 2**20:.1f} MiB a folder "
          f"(built in {built:.1f} s); {a.repeats} runs each, alternated; load average before: "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'binding':<34} {'wall s':>8} {'CPU s':>8} {'peak RSS MiB':>13}  verify says")
    for name, rs in results.items():
        print(f"{name:<34} {statistics.median(r[0] for r in rs):>8.2f} {statistics.median(r[1] for r in rs):>8.2f} "
              f"{max(r[2] for r in rs) / 2**20:>13.0f}  {rs[-1][3].strip()}")


if __name__ == "__main__":
    main()
