"""Runs of one model written through the real parts (the Journal, the monitor, record_compute, rank keys certified by
a run key, rank 0's countersigned anchor) for the compute statement's tests and tools/bench_compute.py: a run folder
of rank journals, or one journal; steps with a FLOP shape, device samples with NVML's energy counter."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from trainledger.journal import Journal, Signer
from trainledger.journal.certify import RankRoster, anchor_statement
from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored
from trainledger.training.kinds import DeviceSampled
from trainledger.training.health.flops import FlopConfig
from trainledger.training.health.mfu import record_compute
from trainledger.training.health.monitor import TrainingHealthMonitor

#: a small model's FLOP shape: 6N + 12LHQT = 6,000,000 + 12,288 FLOPs a token
SHAPE = FlopConfig(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16, seq_len=64)
FPT = 6 * 1_000_000 + 12 * 2 * 4 * 16 * 64
TOKENS = 512  # a step's tokens on each rank
OPTS = dict(background=False, seal_every=64)


def _steps(j: Journal, *, steps: int, first: int = 0, energy: list[int | None] | None = None,
           thresholds: dict[str, float] | None = None, carried: float = 0.0, sample_every: int = 10) -> None:
    m = TrainingHealthMonitor(journal=j, flop_config=SHAPE, peak_flops_per_sec=1e12, peak_source="given",
                              device_kind="Test GPU", compute_thresholds=thresholds, carried_flops=carried)
    k = 0
    for s in range(first, first + steps):
        m.observe_step(s, 3.0 - 0.001 * s, grad_norm=1.0, step_time_s=0.002, tokens=TOKENS)
        if energy is not None and (s - first) % sample_every == 0 and k < len(energy):
            j.append(DeviceSampled(device=0, power_w=300.0, energy_mj=energy[k]))
            k += 1


def write_journal(path: Path, signer: Signer, *, run_id: str, steps: int = 100, **kw: Any) -> Path:
    """One journal: ``steps`` steps under the monitor, then its compute_totaled, closed."""
    with Journal.create(path, signer=signer, run_id=run_id, **OPTS) as j:
        _steps(j, steps=steps, **kw)
        record_compute(j)
    return path


def anchor_ranks(journals: list[Journal], issuer: Signer, run: str, step: int, *, cosign: bool = True) -> None:
    """What ``anchor_ranks`` records at a point every rank reached: each rank's head sealed, rank 0's
    ``ranks_anchored`` of them (countersigned by ``issuer``, the certifying key), every other rank's
    ``anchor_recorded`` of rank 0's head."""
    heads = []
    for j in journals:
        j.seal(durable=True)
        heads.append((f"{j.head[0]}:{j.head[1]}", j.key_id))
    anchored = {"heads": {str(r): h for r, (h, _) in enumerate(heads)},
                "keys": {str(r): k for r, (_, k) in enumerate(heads)}}
    cosig = base64.b64encode(issuer.sign(anchor_statement(run, step, **anchored))).decode()
    journals[0].append(RanksAnchored(**anchored, step=step, cosig=cosig if cosign else None), durable=True)
    for r in range(1, len(journals)):
        journals[r].append(AnchorRecorded(rank=0, head=heads[0][0], key=heads[0][1], step=step), durable=True)


def write_run_folder(d: Path, issuer: Signer, *, run: str, world: int = 2, steps: int = 40,
                     energy: bool = True) -> Path:
    """A run folder as the ranks write it with ephemeral keys certified by ``issuer`` (one roster), each rank's
    steps and device samples, rank 0's anchor countersigned by the issuer, then every rank's compute_totaled."""
    d.mkdir(parents=True, exist_ok=True)
    keys = [Signer.generate() for _ in range(world)]
    roster = RankRoster.sign(issuer, run=run, round=0, keys=[k.public for k in keys])
    journals = []
    for r in range(world):
        j = Journal.create(d / f"rank-{r:05d}.jsonl", signer=keys[r], run_id=f"{run}.r{r:05d}",
                           certificate=roster.certificate(r), meta={"run": run, "rank": r, "world_size": world}, **OPTS)
        j.append(RankJoined(run=run, rank=r, world_size=world, local_rank=r, node="node-0", restart_count=0,
                            versions={}), durable=True)
        _steps(j, steps=steps, energy=[1_000_000 * i for i in range(steps // 10 + 1)] if energy else None)
        journals.append(j)
    anchor_ranks(journals, issuer, run, steps)
    for j in journals:
        record_compute(j)
        j.close()
    return d
