"""A small Lightning DDP run on CPU (2 processes, Lightning's own launcher) that plants one failure.

    python sample_logs/generate/frameworks/lightning_train.py --scenario lightning_non_finite_loss --out DIR

``Trainer(strategy="ddp", devices=2, accelerator="cpu")`` re-runs this script for rank 1 (the
subprocess script launcher); both processes write to the same console. ``CSVLogger`` writes
``DIR/lightning_logs/version_0/metrics.csv`` (rank 0 only, as every Lightning logger). The
planted line follows a ``# PLANTED(<scenario>)`` comment; ``make_samples.py`` finds it there.
"""

import argparse
from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FAIL_STEP = 4  # the optimizer step (0-based global_step) at which the planted failure fires


class Regressor(L.LightningModule):
    def __init__(self, scenario):
        super().__init__()
        self.scenario = scenario
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = self.corrupt(x)
        self.check_batch(x)
        loss = nn.functional.mse_loss(self.net(x), y)
        # sync_dist: the logged loss is the mean over the ranks, so a NaN on any rank shows
        self.log("train_loss", loss, on_step=True, prog_bar=True, sync_dist=True)
        return loss

    def corrupt(self, x):
        if self.scenario == "lightning_non_finite_loss" and self.global_rank == 1 and self.global_step == FAIL_STEP:
            x = x.clone()
            # PLANTED(lightning_non_finite_loss): a corrupt record: one NaN feature in rank 1's batch
            x[0, 0] = float("nan")
        return x

    def check_batch(self, x):
        if self.scenario == "lightning_rank_exception" and self.global_rank == 1 and self.global_step == FAIL_STEP:
            # PLANTED(lightning_rank_exception): rank 1 rejects its batch
            raise ValueError(f"bad batch at step {self.global_step}: features shape {tuple(x.shape)} has NaN rows")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True, choices=["lightning_non_finite_loss", "lightning_rank_exception"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(640, 16)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=30)),
        max_steps=10, log_every_n_steps=1, logger=CSVLogger(args.out), default_root_dir=args.out,
        enable_checkpointing=False,
    )
    trainer.fit(Regressor(args.scenario), DataLoader(data, batch_size=32))


if __name__ == "__main__":
    main()
