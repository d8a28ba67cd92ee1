"""A per-group strategy decoder and its REINFORCE training on the environment.

Candidates (``candidates``): for a cluster of D devices, each device alone (model
parallel), the whole cluster replicated with AllReduce and even or speed-proportional
batch shares, and the whole cluster replicated with proportional shares and a
parameter server on each device in turn: ``2D + 2`` strategies per group. Each
candidate is embedded from the encoder's device embeddings (the device, or the mean
over the replica set plus the server's embedding) and a learned embedding of its kind;
the decoder scores ``MLP(group embedding ‖ candidate embedding)`` and samples one
candidate per group independently (a softmax per group).

Training (``reinforce``): REINFORCE with a moving-average baseline, as HeteroG trains
its policy: sample a strategy for every group, score it with ``StrategyEnv.evaluate``,
and push up the log-probability of the sampled strategy in proportion to the reward's
advantage over the baseline, normalised by the baseline's magnitude so one learning
rate serves graphs of any iteration time. Seeded: same problem, seed and episodes give
the same weights.

Limits: replica sets are the single devices or the whole cluster (no subsets yet);
groups are decided independently given the embeddings (no autoregressive decoding);
one (graph, cluster) per training call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from dl_nfv.artifacts import SyncMethod

from .encoder import GroupEncoder
from .env import GroupStrategy, Outcome, StrategyEnv
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Training:
    """What ``reinforce`` did: the best strategy it sampled and the reward per episode."""

    best: tuple[GroupStrategy, ...]
    best_outcome: Outcome
    rewards: tuple[float, ...]


def reinforce(policy: StrategyPolicy, env: StrategyEnv, graph: GroupGraph, *, episodes: int,
              seed: int = 0, learning_rate: float = 0.01, baseline_decay: float = 0.9) -> Training:
    """Train ``policy`` on one environment by REINFORCE with a moving-average baseline.

    Complexity: ``episodes`` x (one encoder pass + one simulation). The network is small,
    so it runs on one thread: more threads only contend (tens of times slower on a loaded
    two-core machine).
    """
    with _one_thread():
        return _reinforce(policy, env, graph, episodes=episodes, seed=seed,
                          learning_rate=learning_rate, baseline_decay=baseline_decay)


def _reinforce(policy: StrategyPolicy, env: StrategyEnv, graph: GroupGraph, *, episodes: int,
               seed: int, learning_rate: float, baseline_decay: float) -> Training:
    options = candidates(env.devices)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    baseline: float | None = None
    best: tuple[tuple[GroupStrategy, ...], Outcome] | None = None
    rewards = []
    for _ in range(episodes):
        logits = policy(graph, options)
        dist = torch.distributions.Categorical(logits=logits)
        picks = torch.multinomial(torch.softmax(logits.detach(), dim=1), 1, generator=generator).squeeze(1)
        strategies = tuple(options[int(i)].strategy for i in picks)
        outcome = env.evaluate(strategies)
        rewards.append(outcome.reward)
        if best is None or outcome.reward > best[1].reward:
            best = (strategies, outcome)
        baseline = outcome.reward if baseline is None else (
            baseline_decay * baseline + (1 - baseline_decay) * outcome.reward)
        advantage = (outcome.reward - baseline) / max(abs(baseline), 1e-9)
        loss = -advantage * dist.log_prob(picks).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert best is not None
    return Training(best=best[0], best_outcome=best[1], rewards=tuple(rewards))


def greedy(policy: StrategyPolicy, env: StrategyEnv, graph: GroupGraph) -> tuple[GroupStrategy, ...]:
    """Each group's most likely candidate."""
    options = candidates(env.devices)
    with torch.no_grad():
        picks = policy(graph, options).argmax(dim=1)
    return tuple(options[int(i)].strategy for i in picks)


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch's CPU kernels on one thread for a while, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
