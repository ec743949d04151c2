#!/usr/bin/env python3
"""The writer's two paths, as a whole process pays for them: CPU time a step (the process's, every thread included)
for 300,000 built ``step_observed`` events written by ``Journal.append_deferred`` (the training loop's path: the
Recorder, the monitor, the callbacks; every drain, seal, flush and the close included) and by ``Journal.append``.

    .venv/bin/python tools/bench_append_paths.py deferred append
    PYTHONPATH=VIEW .venv/bin/python tools/bench_append_paths.py deferred append   # another tree, as
                                                                                    # tools/bench_before_after.sh links it

Output kept in docs/bench/writer.txt.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from trainledger.journal import Journal, StepObserved
from trainledger.journal.keys import Signer

N = 300_000


def main(paths: list[str]) -> int:
    evs = [StepObserved(step=i, loss=1.0 + i * 1e-6, grad_norm=0.5, lr=1e-3, tokens=4096, step_time_s=0.01)
           for i in range(N)]
    signer = Signer.generate()
    for how in paths or ["deferred", "append"]:
        if how not in ("deferred", "append"):
            print(f"unknown path {how!r}: deferred or append", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as d:
            j = Journal.create(os.path.join(d, "j.jsonl"), signer=signer)
            f = j.append_deferred if how == "deferred" else j.append
            t0 = time.process_time()
            for e in evs:
                f(e)
            j.close()
            print(f"{how}: {(time.process_time() - t0) / N * 1e6:.2f} us CPU a step (the process's, threads "
                  f"included; {N:,} steps and the close)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
