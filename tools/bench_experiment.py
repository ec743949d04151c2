#!/usr/bin/env python3
"""Wall-clock of the experiment tooling on the tiny example, medians of N rounds in this process.

    .venv/bin/python tools/bench_experiment.py [--rounds 3]

Times: `trainledger manifest validate` of the example (in-process), a full
preflight that passes every gate (a template check and an approval supplied),
the 160-update example experiment, and `trainledger report` of its journal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from trainledger.journal import Journal, Signer
    from trainledger.report import write_report
    from trainledger.training.experiment.loop import run_experiment, write_example
    from trainledger.training.experiment.manifest import load_findings
    from trainledger.training.audit.approval import sign_approval
    from trainledger.training.experiment.preflight import run_preflight

    times: dict[str, list[float]] = {"manifest validate": [], "full preflight (10 gates)": [],
                                     "example experiment (160 updates)": [], "report": []}
    for r in range(args.rounds):
        d = Path(tempfile.mkdtemp(prefix="tl-exp-"))
        path = write_example(d)
        signer, lead = Signer.generate(), Signer.generate()
        t = time.perf_counter()
        m, findings = load_findings(path)
        times["manifest validate"].append(time.perf_counter() - t)
        assert m is not None and not findings
        t = time.perf_counter()
        with Journal.create(d / "preflight.jsonl", signer=signer, manifest_id=m.identity) as j:
            res = run_preflight(m, d, j, template_check=lambda m, root: (True, "raw tokens"),
                                approval=sign_approval(lead, authority="research-lead", manifest_id=m.identity),
                                approvers={"research-lead": [lead.public]})
        times["full preflight (10 gates)"].append(time.perf_counter() - t)
        assert res.ready, res.status
        t = time.perf_counter()
        out = run_experiment(m, d, d / "run", signer=signer)
        times["example experiment (160 updates)"].append(time.perf_counter() - t)
        assert out["stopped"] is None
        t = time.perf_counter()
        write_report(d / "run" / "journal.jsonl", d / "report.html", keys=[signer.public])
        times["report"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"tiny example, medians of {args.rounds} rounds (the first round includes warm-up)")
    for k, v in med.items():
        print(f"  {k}: {v:.3f} s")
    print(json.dumps(med))
    return 0


if __name__ == "__main__":
    sys.exit(main())
