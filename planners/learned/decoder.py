"""A per-group strategy decoder: which candidate strategy each op group takes.

Candidates (``candidates``): for a cluster of D devices, each device alone (model
parallel), the whole cluster replicated with AllReduce and even or speed-proportional
batch shares, the whole cluster replicated with proportional shares and a parameter
server on each device in turn, and each replica subset (``replica_subsets``: the
devices of one type, or of one host) with AllReduce and proportional shares:
``2D + 2 + subsets`` strategies per group. Each candidate is embedded from the
encoder's device embeddings (the mean over its devices, plus its server's) and a
learned embedding of its kind;
the decoder scores ``MLP(group embedding ‖ candidate embedding)`` and samples one
candidate per group independently (a softmax per group).

``reinforce.py`` trains it; ``greedy`` reads each group's most likely candidate.

Limits: replica sets are single devices, the whole cluster, and the per-type and
per-host subsets (no other subsets, and a parameter server only over the whole cluster);
groups are decided independently given the embeddings (no autoregressive decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dl_nfv.artifacts import Cluster, SyncMethod

from .encoder import GroupEncoder
from .env import GroupStrategy, StrategyEnv
from .features import GroupGraph

# candidate kinds, in the order of the kind embedding
SINGLE, ALLREDUCE_EVEN, ALLREDUCE_PROP, PS_PROP, SUBSET_PROP = range(5)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A strategy a group may take, with what the decoder embeds it from: its kind, its
    devices (indices into the cluster's device order) and its parameter server's."""

    kind: int
    strategy: GroupStrategy
    members: tuple[int, ...]
    server: int = -1  # -1: none


def candidates(cluster: Cluster) -> list[Candidate]:
    """The candidate strategies of a group on ``cluster`` (module docstring), in a fixed
    order: each device alone; the whole cluster with AllReduce, even then proportional
    shares; the whole cluster with a server on each device; then each replica subset."""
    devices = tuple(cluster.device_names)
    every = tuple(range(len(devices)))
    out = [Candidate(kind=SINGLE, strategy=GroupStrategy(devices=(d,)), members=(i,))
           for i, d in enumerate(devices)]
    if len(devices) < 2:
        return out
    out.append(Candidate(kind=ALLREDUCE_EVEN, strategy=GroupStrategy(devices=devices),
                         members=every))
    out.append(Candidate(kind=ALLREDUCE_PROP, members=every,
                         strategy=GroupStrategy(devices=devices, balance="proportional")))
    out += [Candidate(kind=PS_PROP, members=every, server=i, strategy=GroupStrategy(
        devices=devices, balance="proportional", sync=SyncMethod.PS, ps_server=d))
        for i, d in enumerate(devices)]
    for members in replica_subsets(cluster):
        out.append(Candidate(kind=SUBSET_PROP, members=members, strategy=GroupStrategy(
            devices=tuple(devices[i] for i in members), balance="proportional")))
    return out


def replica_subsets(cluster: Cluster) -> list[tuple[int, ...]]:
    """Device sets a group may be replicated over short of the whole cluster: the devices
    of each type, then of each host, where that is at least two devices and not all of
    them; each set once (a host of one type repeats its type's set when the type lives
    on that host alone), as indices into the cluster's device order."""
    names = list(cluster.device_names)
    by_type: dict[str, list[int]] = {}
    by_host: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        device = cluster.device(name)
        by_type.setdefault(device.type.name, []).append(i)
        by_host.setdefault(device.host, []).append(i)
    subsets = dict.fromkeys(tuple(members) for members in (*by_type.values(), *by_host.values())
                            if 2 <= len(members) < len(names))
    return list(subsets)


class StrategyPolicy(nn.Module):
    """Encoder plus decoder: logits ``[groups, candidates]`` for a ``GroupGraph``."""

    def __init__(self, *, hidden: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.encoder = GroupEncoder(hidden=hidden, layers=layers, heads=heads)
        self.kind = nn.Embedding(SUBSET_PROP + 1, hidden)
        self.score = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, graph: GroupGraph, options: list[Candidate]) -> torch.Tensor:
        groups, devices = self.encoder(graph)
        cands = candidate_embeddings(devices, options, self.kind)  # [C, H]
        g, k = groups.shape[0], cands.shape[0]
        pairs = torch.cat([groups.unsqueeze(1).expand(g, k, -1), cands.unsqueeze(0).expand(g, k, -1)],
                          dim=2)
        return self.score(pairs).squeeze(-1)


def candidate_embeddings(devices: torch.Tensor, options: list[Candidate],
                         kind: nn.Embedding) -> torch.Tensor:
    """``[candidates, hidden]``: each candidate's mean device embedding, plus its
    parameter server's embedding (if any), plus its kind's embedding."""
    none = torch.zeros_like(devices[0])
    rows = []
    for c in options:
        members = devices[list(c.members)].mean(dim=0)
        server = devices[c.server] if c.server >= 0 else none
        rows.append(members + server + kind.weight[c.kind])
    return torch.stack(rows)


def greedy(policy: StrategyPolicy, env: StrategyEnv, graph: GroupGraph) -> tuple[GroupStrategy, ...]:
    """Each group's most likely candidate."""
    options = candidates(env.cm.cluster)
    with torch.no_grad():
        picks = policy(graph, options).argmax(dim=1)
    return tuple(options[int(i)].strategy for i in picks)

