#!/usr/bin/env python3
"""What a document about a model costs (docs/bom.md), beside its floors, in one run:

    .venv/bin/python tools/bench_bom.py --out docs/bench/bom.txt

A pre-training journal of STEPS steps (the health monitor over every step, an energy sample every 100, a
configuration, an evaluation, an export) and a fine-tune of a tenth of it, written through the real parts; then
each format written by 'trainledger bom' (which verifies and replays both runs first) beside 'trainledger replay'
of the same two journals (its floor: a document rests only on what replay recomputes), and 'verify-bom' beside
'verify-proof' of one bundle of the same lines (its floor: the proofs it must check). Each command is its own
process, timed whole (wall, and CPU and peak memory of the child).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_report import finish, header

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "trainledger"]


def _journal(path: Path, signer, run_id: str, steps: int, base: str | None) -> str:
    from trainledger.journal import Journal
    from trainledger.journal.kinds import ModelExported
    from trainledger.journal.statements.release.manifest import FileDigest, root_digest
    from trainledger.training.health.flops import FlopConfig
    from trainledger.training.health.mfu import record_compute
    from trainledger.training.health.monitor import TrainingHealthMonitor
    from trainledger.training.kinds import ConfigLogged, DeviceSampled, EvaluationRecorded

    with Journal.create(path, signer=signer, run_id=run_id, background=False) as j:
        j.append(ConfigLogged(config={"lr": 3e-4, "batch_size": 256, "optimizer": "adamw"}, source="wandb.config"))
        m = TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=124_000_000, n_layer=12, n_head=12,
                                                                    head_dim=64, seq_len=1024),
                                  peak_flops_per_sec=989.4e12, peak_source="datasheet")
        for s in range(steps):
            m.observe_step(s, 3.0 - 1e-6 * s, grad_norm=1.0, step_time_s=0.5, tokens=262_144)
            if s % 100 == 0:
                j.append(DeviceSampled(device=0, power_w=650.0, energy_mj=32_500_000 * s))
        j.append(EvaluationRecorded(hook="heldout", role="target", step=steps - 1, checkpoint="ckpt",
                                    checkpoint_sha256="0" * 64, metrics={"loss": 2.75}, cases=4096,
                                    cases_sha256="1" * 64, cases_path="cases.jsonl"))
        files = [{"file": "model.safetensors", "bytes": 10, "sha256": hashlib.sha256(run_id.encode()).hexdigest()}]
        digest = root_digest(FileDigest(f["file"], f["bytes"], f["sha256"]) for f in files)
        j.append(ModelExported(path="export", digest=digest, files=files, base=base), durable=True)
        record_compute(j)
    return digest


def _timed(args: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, stdout) of one command in its own process (its own rusage, by wait4)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}: {text}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000, help="the pre-training's steps (default 1,000,000)")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    from trainledger.journal.keys import keygen, load_signer

    lines = header("bench_bom.py")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        keygen(d, name="k")
        signer = load_signer(d / "k.key")
        t = time.perf_counter()
        base = _journal(d / "pretrain.jsonl", signer, "pretrain", args.steps, None)
        _journal(d / "finetune.jsonl", signer, "finetune", args.steps // 10, base)
        size = sum((d / f).stat().st_size for f in ("pretrain.jsonl", "finetune.jsonl"))
        lines.append(f"runs: a pre-training of {args.steps:,} steps and a fine-tune of {args.steps // 10:,} "
                     f"({size / 2**20:.1f} MiB of journal), written in {time.perf_counter() - t:.1f} s")
        pub = ["--pubkey", str(d / "k.pub")]
        runs = [str(d / "pretrain.jsonl"), str(d / "finetune.jsonl")]
        walls = []
        for r in runs:
            walls.append(_timed(CLI + ["replay", r, *pub]))
        rw, rc, rm = sum(w[0] for w in walls), sum(w[1] for w in walls), max(w[2] for w in walls)
        lines.append(f"1. floor: 'trainledger replay' of each journal (two processes, as replay takes one journal): "
                     f"{rw:.2f} s wall, {rc:.2f} s CPU together, peak RSS {rm:.0f} MiB")
        for fmt in ("cyclonedx", "spdx", "hf-card", "intoto-eval"):
            out = d / f"doc.{fmt}"
            w, c, m, _ = _timed(CLI + ["bom", *runs, *pub, "--key", str(d / "k.key"), "--format", fmt,
                                       "-o", str(out)])
            vw, vc, vm, _ = _timed(CLI + ["verify-bom", str(out), *pub])
            pack = Path(str(out) + ".proof.json").stat().st_size
            lines.append(f"   bom --format {fmt}: {w:.2f} s wall, {c:.2f} s CPU ({c / rc:.2f}x replay's), peak RSS "
                         f"{m:.0f} MiB; document {out.stat().st_size:,} bytes, proof pack {pack:,} bytes")
            lines.append(f"   verify-bom: {vw:.2f} s wall, {vc:.2f} s CPU, peak RSS {vm:.0f} MiB")
        bundle = d / "lines.proof.json"
        w, c, m, _ = _timed(CLI + ["prove", runs[0], *pub, "--compute", "-o", str(bundle)])
        vw, vc, vm, _ = _timed(CLI + ["verify-proof", str(bundle), *pub])
        lines.append(f"2. floor of verify-bom: 'verify-proof' of one bundle of the pre-training's total and closing "
                     f"lines: {vw:.2f} s wall, {vc:.2f} s CPU, peak RSS {vm:.0f} MiB (a new process: most of it is "
                     "Python starting and importing)")
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
