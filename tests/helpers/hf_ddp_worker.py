"""Run under real torchrun (gloo, CPU) by tests/integration/training/test_hf.py: a Trainer on 2 ranks with the callback,
rank 1's forward 3x rank 0's (a sleep: 0.3 s against 0.1 s; only rank 0 alone stalling some 0.14 s a step would
hide it), straggler windows of 3 steps, fingerprints every 2 steps and at each save, replay checks of steps 0 and 3
(ReplayCheckTrainer).

    python -m torch.distributed.run --standalone --nproc_per_node=2 hf_ddp_worker.py OUTPUT_DIR KEY
"""

import sys
import time
import warnings

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from trainledger.training.integrations.hf import ReplayCheckTrainer, TrainledgerCallback

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randint(0, 64, (128, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main() -> None:
    out, key = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    rank = int(__import__("os").environ["RANK"])
    model.register_forward_pre_hook(lambda m, a: time.sleep(0.1 * (3.0 if rank == 1 else 1.0)))  # rank 1: 3x
    args = TrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=4, save_steps=3,
                             report_to="none", use_cpu=True, ddp_backend="gloo", disable_tqdm=True, seed=0)
    cb = TrainledgerCallback(key=key, straggler_every=3, fingerprint_every=2, sdc_check=3)
    ReplayCheckTrainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb]).train()


if __name__ == "__main__":
    main()
