"""Run under real torchrun by tests/integration/training/test_distributed_loop.py: the distributed reference loop (DDP over
gloo), optionally SIGKILLing rank 1 at a step of the first attempt so that torchrun restarts the group.

    python -m torch.distributed.run --standalone --nproc_per_node=2 --max-restarts=1 dist_loop_worker.py \
        RUN_DIR KEY STEPS [DIE_AT]
Each rank writes RUN_DIR/../out-RANK.json: the steps this process trained, their losses (as float.hex) and a
digest of the final parameters.
"""

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from trainledger.journal import load_signer
from trainledger.training.distributed.loop import run_distributed_training
from trainledger.training.reference.loop import LoopConfig


def main() -> None:
    run_dir, key, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    rank = int(os.environ["RANK"])

    def on_step(step: int) -> None:
        if die_at is not None and first and rank == 1 and step == die_at:
            time.sleep(1.0)  # the step-19 checkpoint, saved in the background, is on record by now even under load
            os.kill(os.getpid(), signal.SIGKILL)

    out = run_distributed_training(run_dir, signer=load_signer(key), config=LoopConfig(steps=steps, ckpt_every=10),
                                   straggler_every=10, on_step=on_step)
    h = hashlib.sha256()
    for name, t in sorted(out["params"].items()):
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    (Path(run_dir).parent / f"out-{rank}.json").write_text(json.dumps({
        "start": out["start"], "losses": [x.hex() for x in out["losses"]], "params": h.hexdigest(),
        "restarts": out["report"]["restarts"]["count"]}))


if __name__ == "__main__":
    main()
