"""A small Lightning run on one GPU whose training step keeps every step's loss: a memory leak.

    python sample_logs/generate/frameworks/lightning_leak_cuda.py --scenario lightning_memory_leak_cuda --out DIR

``Trainer(accelerator="gpu", devices=1)`` with Lightning's ``DeviceStatsMonitor`` callback, which logs
``torch.cuda.memory_stats()`` at every batch into ``DIR/lightning_logs/version_0/metrics.csv``
(``CSVLogger``). Each training step also runs the model on its batch for a running metric and
keeps that output, graph and all (no ``torch.no_grad()``, no backward frees it): each step's
activations outlive it. ``make_samples.py`` runs ``nvidia-smi --query-gpu=... --format=csv`` beside
it into ``DIR/gpu.csv``. The planted line follows a ``# PLANTED(<scenario>)`` comment.
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                                 nn.Linear(4096, 1))
        self.recent_preds = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.keep_for_smoothing(x)
        self.log("train_loss", loss, on_step=True, prog_bar=True)
        return loss

    def keep_for_smoothing(self, x):
        # PLANTED(lightning_memory_leak_cuda): a forward for a metric, kept with its graph (no torch.no_grad())
        self.recent_preds.append(self.net(x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True, choices=["lightning_memory_leak_cuda"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(512 * 150, 1024)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_steps=150, log_every_n_steps=1, logger=CSVLogger(args.out),
        default_root_dir=args.out, enable_checkpointing=False, callbacks=[DeviceStatsMonitor()],
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=512))


if __name__ == "__main__":
    main()
