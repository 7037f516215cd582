"""A small Hugging Face ``Trainer`` run on CPU (2 processes: torchrun or accelerate launch) that plants one failure.

    torchrun --nproc-per-node 2 sample_logs/generate/frameworks/hf_trainer_train.py \\
        --scenario hf_trainer_non_finite_loss --out DIR

(or ``accelerate launch --multi_gpu --num_processes 2 ...``: make_samples.py has the command and
why ``--cpu``, which starts one process whatever ``--num_processes`` says, is not it.)

A tiny regression MLP (no model or data set is downloaded) trained by ``Trainer`` with its
defaults (``logging_nan_inf_filter=True``, ``max_grad_norm=1.0``) and ``logging_steps=1``; the
console gets the Trainer's log dicts from rank 0 and ``trainer.save_state()`` writes
``DIR/trainer_state.json`` at the end, as the example scripts do. The planted line follows a
``# PLANTED(<scenario>)`` comment.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

FAIL_STEP = 4  # the 1-based optimizer step whose batch the planted failure corrupts


class Points(Dataset):
    def __init__(self, n=640):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum(dim=0, keepdim=True)}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Collator:
    """Stacks a batch; counts the batches this process has made (one per step: no accumulation)."""

    def __init__(self, scenario, rank):
        self.scenario, self.rank, self.batches = scenario, rank, 0

    def __call__(self, items):
        self.batches += 1
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        return self.corrupt(batch)

    def corrupt(self, batch):
        if self.scenario == "hf_trainer_non_finite_loss" and self.rank == 1 and self.batches == FAIL_STEP:
            # PLANTED(hf_trainer_non_finite_loss): a corrupt record: one NaN feature in rank 1's batch
            batch["x"][0, 0] = float("nan")
        return batch


class CheckedRegressor(Regressor):
    """The model with a check of each training batch (one training forward per optimizer step:
    no accumulation), as a user adds one."""

    def __init__(self, scenario, rank):
        super().__init__()
        self.scenario, self.rank, self.steps = scenario, rank, 0

    def forward(self, x, labels=None):
        if self.training:
            self.steps += 1
            self.check_batch(x)
        return super().forward(x, labels)

    def check_batch(self, x):
        if self.scenario == "hf_trainer_rank_exception" and self.rank == 1 and self.steps == FAIL_STEP:
            # PLANTED(hf_trainer_rank_exception): rank 1 rejects its batch
            raise ValueError(f"bad batch at step {self.steps}: features shape {tuple(x.shape)} has NaN rows")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True, choices=["hf_trainer_non_finite_loss", "hf_trainer_rank_exception"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    args = TrainingArguments(output_dir=a.out, max_steps=10, logging_steps=1, per_device_train_batch_size=32,
                             learning_rate=0.01, save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=CheckedRegressor(a.scenario, args.process_index), args=args, train_dataset=Points(),
                      data_collator=Collator(a.scenario, args.process_index))
    trainer.train()
    trainer.save_state()


if __name__ == "__main__":
    main()
