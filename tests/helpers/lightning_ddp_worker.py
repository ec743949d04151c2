"""Run under real torchrun (gloo, CPU) by tests/integration/training/test_lightning.py: Lightning DDP on 2 ranks with the
callback, rank 1's compute 3x rank 0's (a sleep: 0.3 s against 0.1 s; only rank 0 alone stalling some 0.14 s a step
would hide it), straggler windows of 3 steps, fingerprints every 2 steps and at each checkpoint, replay checks
of steps 0 and 3.

    python -m torch.distributed.run --standalone --nproc_per_node=2 lightning_ddp_worker.py RUN_DIR KEY
"""

import sys
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from trainledger.training.integrations.lightning import TrainledgerCallback

warnings.filterwarnings("ignore")


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        time.sleep(0.1 * (3.0 if self.global_rank == 1 else 1.0))  # rank 1's own work takes 3x rank 0's
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        xs = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=8)


def main() -> None:
    run, key = sys.argv[1], sys.argv[2]
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[TrainledgerCallback(run, key=key, straggler_every=3, fingerprint_every=2,
                                                       sdc_check=3),
                                   ModelCheckpoint(dirpath=f"{run}/ckpts", every_n_train_steps=3, save_top_k=-1)])
    trainer.fit(Tiny())


if __name__ == "__main__":
    main()
