"""A training script shaped like karpathy/nanoGPT's ``train.py``, with the lines its README adds for trainledger
(marked ``# +trainledger``). Its own checkpoint is ``OUT_DIR/ckpt.pt`` (model, optimizer, iter_num), written over
itself every ``eval_interval`` iterations; on ``init_from=resume`` it loads that file before the optimizer exists.

    python nanogpt_shaped.py OUT_DIR KEY scratch|resume MAX_ITERS [DIE_AT]

With DIE_AT the process kills itself (SIGKILL) at that iteration, as a preempted job dies.
"""

import os
import signal
import sys

import torch

from trainledger.training import Recorder, check_checkpoint                       # +trainledger


def main() -> None:
    out_dir, key, init_from, max_iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    die_at = int(sys.argv[5]) if len(sys.argv) > 5 else None
    eval_interval = 10
    torch.set_num_threads(1)
    torch.manual_seed(1337)
    os.makedirs(out_dir, exist_ok=True)
    model_args = dict(n_in=16, n_hidden=32)
    iter_num = 0
    if init_from == "resume":
        ckpt_path = os.path.join(out_dir, "ckpt.pt")
        check_checkpoint(ckpt_path, run_dir=out_dir, key=key)                      # +trainledger
        checkpoint = torch.load(ckpt_path, map_location="cpu")
        model_args = checkpoint["model_args"]
        iter_num = checkpoint["iter_num"]
    model = torch.nn.Sequential(torch.nn.Linear(model_args["n_in"], model_args["n_hidden"]), torch.nn.GELU(),
                                torch.nn.Linear(model_args["n_hidden"], 1))
    if init_from == "resume":
        model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if init_from == "resume":
        optimizer.load_state_dict(checkpoint["optimizer"])
        checkpoint = None
    rec = Recorder(out_dir, key=key, model=model, optimizer=optimizer)            # +trainledger
    assert rec.start == iter_num, (rec.start, iter_num)
    g = torch.Generator().manual_seed(iter_num)
    while True:
        if iter_num % eval_interval == 0 and iter_num > 0:
            ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
                    "iter_num": iter_num}
            torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
            rec.record_checkpoint(os.path.join(out_dir, "ckpt.pt"), step=iter_num - 1)  # +trainledger
        if iter_num == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(32, model_args["n_in"], generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :1] * x[:, 1:2])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        rec.step(iter_num, loss.item(), tokens=32, lr=3e-3)                       # +trainledger
        iter_num += 1
        if iter_num > max_iters:
            break
    rec.close()                                                                     # +trainledger


if __name__ == "__main__":
    main()
