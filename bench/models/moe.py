"""A top-2 Mixture-of-Experts MLP, written as a user outside dl-nfv would write one.

A router scores four expert MLPs per sample; ``torch.topk`` picks each sample's two best,
each expert computes on the rows routed to it (boolean routing: ``torch.where`` on the
choices, so its row count depends on the data) and ``index_add`` sums the gated outputs
back in place of the rows; a residual and a linear head follow.

    dl-nfv profile model bench/models/moe.py:build --input-shape 32,256
"""

from __future__ import annotations

import torch
from torch import nn


class TopTwoMoE(nn.Module):
    def __init__(self, d_model: int = 256, hidden: int = 1024, experts: int = 4, classes: int = 10):
        super().__init__()
        self.router = nn.Linear(d_model, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, hidden), nn.ReLU(), nn.Linear(hidden, d_model))
            for _ in range(experts))
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(torch.softmax(self.router(x), dim=-1), k=2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            gate = weights[rows, slot].unsqueeze(-1)
            out = out.index_add(0, rows, expert(x[rows]) * gate)
        return self.head(out + x)


def build() -> nn.Module:
    """Top-2 MoE over 4 experts of hidden size 1024 for ``--input-shape 32,256``."""
    return TopTwoMoE()
