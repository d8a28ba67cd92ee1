"""A per-group strategy decoder: which candidate strategy each op group takes.

Candidates (``candidates``): for a cluster of D devices, each device alone (model
parallel), the whole cluster replicated with AllReduce and even or speed-proportional
batch shares, and the whole cluster replicated with proportional shares and a
parameter server on each device in turn: ``2D + 2`` strategies per group. Each
candidate is embedded from the encoder's device embeddings (the device, or the mean
over the replica set plus the server's embedding) and a learned embedding of its kind;
the decoder scores ``MLP(group embedding ‖ candidate embedding)`` and samples one
candidate per group independently (a softmax per group).

``reinforce.py`` trains it; ``greedy`` reads each group's most likely candidate.

Limits: replica sets are the single devices or the whole cluster (no subsets yet);
groups are decided independently given the embeddings (no autoregressive decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dl_nfv.artifacts import SyncMethod

from .encoder import GroupEncoder
from .env import GroupStrategy, StrategyEnv
from .features import GroupGraph

# candidate kinds, in the order of the kind embedding
SINGLE, ALLREDUCE_EVEN, ALLREDUCE_PROP, PS_PROP = range(4)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A strategy a group may take, with what the decoder embeds it from."""

    kind: int
    strategy: GroupStrategy
    device: int = -1  # the device alone, or the parameter server (-1: none)


def candidates(devices: tuple[str, ...]) -> list[Candidate]:
    """The ``2D + 2`` candidate strategies of a cluster with ``devices`` (module docstring)."""
    out = [Candidate(kind=SINGLE, strategy=GroupStrategy(devices=(d,)), device=i)
           for i, d in enumerate(devices)]
    if len(devices) > 1:
        out.append(Candidate(kind=ALLREDUCE_EVEN, strategy=GroupStrategy(devices=devices)))
        out.append(Candidate(kind=ALLREDUCE_PROP,
                             strategy=GroupStrategy(devices=devices, balance="proportional")))
        out += [Candidate(kind=PS_PROP, device=i, strategy=GroupStrategy(
            devices=devices, balance="proportional", sync=SyncMethod.PS, ps_server=d))
            for i, d in enumerate(devices)]
    return out


class StrategyPolicy(nn.Module):
    """Encoder plus decoder: logits ``[groups, candidates]`` for a ``GroupGraph``."""

    def __init__(self, *, hidden: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.encoder = GroupEncoder(hidden=hidden, layers=layers, heads=heads)
        self.kind = nn.Embedding(4, hidden)
        self.score = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, graph: GroupGraph, options: list[Candidate]) -> torch.Tensor:
        groups, devices = self.encoder(graph)
        whole = devices.mean(dim=0)
        rows = []
        for c in options:
            base = devices[c.device] if c.kind == SINGLE else whole
            extra = devices[c.device] if c.kind == PS_PROP else torch.zeros_like(whole)
            rows.append(base + extra + self.kind.weight[c.kind])
        cands = torch.stack(rows)  # [C, H]
        g, k = groups.shape[0], cands.shape[0]
        pairs = torch.cat([groups.unsqueeze(1).expand(g, k, -1), cands.unsqueeze(0).expand(g, k, -1)],
                          dim=2)
        return self.score(pairs).squeeze(-1)


def greedy(policy: StrategyPolicy, env: StrategyEnv, graph: GroupGraph) -> tuple[GroupStrategy, ...]:
    """Each group's most likely candidate."""
    options = candidates(env.devices)
    with torch.no_grad():
        picks = policy(graph, options).argmax(dim=1)
    return tuple(options[int(i)].strategy for i in picks)

