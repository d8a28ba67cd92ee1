"""PUCT Monte Carlo tree search over TAG's decisions: the batching, then group by group.

State: where there is more than one ``choices`` batching (``batching.batchings``: the
microbatch count and the GPipe or 1F1B schedule), first the batching, then a strategy
for each of the first k op groups of a fixed decision order, **largest first** (the
group's forward plus backward ms on its fastest device type, descending; ties in
topological order), so the search spends itself on the groups that weigh most. Actions
at a group's depth: the candidates of ``learned.decoder.candidates`` (a device, or a
replica set with its batch shares and AllReduce or a parameter server), plus the
strategies of any ``seeds`` outside them, less those whose replicas would hold less
than a sample per microbatch of the batching taken (masked).

Values are in log units relative to a reference time ``ref_ms`` (the best data-parallel
baseline's simulated iteration, or the start where none fits): a strategy whose
effective time is ``ms`` (``batching.BatchedEnv.evaluate``: the simulated iteration time,
scaled up for a memory overflow or an invalid batching) is worth ``log(ref_ms / ms)``.

Method (AlphaZero's search, after Silver et al. 2017, with exact rollouts):

* A playout descends from the root by PUCT, ``argmax_a Q(a) + c_puct P(a) sqrt(N) /
  (1 + N(a))``, with ``Q`` scaled to [0, 1] by the least and greatest values met so far
  (as MuZero does: values here have no fixed range) and an unvisited action valued at
  its parent's mean value, to a leaf; expanding the leaf reads its priors ``P`` (and a
  value) from the joint-graph network (``joint.JointNet``), or uniform priors where no
  network is given. The batching decision always has uniform priors (the network has no
  head for it), and in a micro-batched state the network's priors are mixed half and
  half with uniform ones (it was trained on one-microbatch states).
* The leaf's value: the partial strategy completed with the best strategy met so far at
  its batching (before any, the incumbent's groups, a group whose replicas are too many
  for the batching on its fastest replica alone), simulated exactly (memoised); with a
  network, mixed with its value head (``value_weight``). A finished strategy is valued
  by its simulation alone. Every simulated strategy that beats the incumbent becomes it.
* The incumbent starts as the best given start: ``start`` with one microbatch, and the
  ``seeds`` (the planner's: other planners' plans as TAG strategies), so the result is
  never worse than any of them.
* Decisions are committed in turn, AlphaZero's way: the batching after
  ``BATCHING_SHARE`` of the playouts, the batching whose best strategy met is best; each
  group after an equal share of the rest, the most visited action (ties: the better mean
  value, then the lower index), which becomes the root (its subtree kept). Each committed
  group decision leaves a training sample: the state, its visit distribution, and (once
  the strategy is finished) the log of its simulated time relative to ``ref_ms``.

Determinism: the root's priors take seeded Dirichlet noise (``noise``; the ties of
uniform priors are broken by it); the network runs on one thread; with the same inputs
and seed the search makes the same choices unless the CPU time limit stops it.

Limits: one decision per group in one fixed order (no backtracking over the order
itself), and the batching committed before the groups are searched at it; values
relative to one reference; the time limit is checked between playouts. Complexity:
``playouts`` x (one network pass + one simulation) at most, a simulation's cost growing
with the microbatch count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..base import device_speeds
from ..learned.decoder import candidates
from ..learned.env import GroupStrategy, Outcome, StrategyEnv
from ..learned.features import GroupGraph
from ..learned.reinforce import one_thread
from .batching import ONE, BatchedEnv, Batching, candidate_of
from .joint import JointNet, JointStatic, joint_graph

C_PUCT = 1.25
NOISE_ALPHA = 0.3
UNSEEN_UNIFORM = 0.5  # uniform share of the priors of a micro-batched state
BATCHING_SHARE = 0.25  # of the playouts, for the batching decision (where there is one)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One committed decision: the placement before it (candidate index per group, None
    where undecided), the group decided, its visit distribution, and the log of the
    finished strategy's time relative to the reference."""

    decided: tuple[int | None, ...]
    current: int
    visits: tuple[float, ...]
    log_ratio: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Search:
    """The best strategy met (its batching and a strategy per group), its outcome, the
    incumbent's, what the search spent and its samples."""

    strategies: tuple[GroupStrategy, ...]
    batching: Batching
    outcome: Outcome
    start: Outcome
    order: tuple[int, ...]
    playouts: int
    evaluations: int
    samples: tuple[Sample, ...]
    stopped_by_time: bool


@dataclass(slots=True)
class _Node:
    prior: np.ndarray | None = None
    value: float = 0.0
    visits: np.ndarray | None = None
    totals: np.ndarray | None = None
    mask: np.ndarray | None = None
    children: dict[int, _Node] = field(default_factory=dict)


def decision_order(features: GroupGraph) -> tuple[int, ...]:
    """Groups largest first: fastest-type ms descending, ties in topological order."""
    work = features.x[:, 0].tolist()  # log1p of the group's ms on its fastest type
    return tuple(sorted(range(len(work)), key=lambda g: (-work[g], g)))


class _Tree:
    """The search's state: environment, network, incumbent and memoised evaluations.

    A path is the actions taken from the root: with more than one batching, first the
    batching's index, then one candidate index per group in decision order."""

    def __init__(self, env: StrategyEnv, features: GroupGraph, net: JointNet | None,
                 starts: Sequence[tuple[Batching, Sequence[GroupStrategy]]],
                 choices: Sequence[Batching], ref_ms: float, value_weight: float, seed: int):
        self.env, self.net = BatchedEnv(env), net
        self.batchings = list(dict.fromkeys([*choices, *(b for b, _ in starts)]))
        self.options = candidates(env.cm.cluster)
        self.index = {c.strategy: i for i, c in enumerate(self.options)}
        for _, strategies in starts:  # a seed's strategies outside the candidates join them
            for s in strategies:
                if s not in self.index:
                    self.index[s] = len(self.options)
                    self.options.append(candidate_of(s, env.devices))
        batch = env.graph.model.batch_size
        self.fewest = [min((round(x * batch) for x in env.group_of(0, c.strategy).shares),
                           default=batch) for c in self.options]  # samples of the least replica
        speed = device_speeds(env.cm, env.devices)
        self.alone = [max(c.members, key=lambda d: (speed[d], -d)) for c in self.options]
        self.order = decision_order(features)
        self.first = 1 if len(self.batchings) > 1 else 0  # decisions before the groups'
        self.static = JointStatic(features, self.options) if net is not None else None
        self.ref_ms, self.value_weight = ref_ms, value_weight
        self.rng = np.random.default_rng(seed)
        self.low, self.high = math.inf, -math.inf  # the values met: Q is scaled to [0, 1] by them
        self.cache: dict[tuple[int, ...], Outcome] = {}
        self.best_key: tuple[int, ...] = ()
        self.best: Outcome | None = None
        self.best_by: dict[int, tuple[tuple[int, ...], float]] = {}  # batching -> best key met
        for b, strategies in starts:  # the incumbent: the best start
            self.outcome((self.batchings.index(b), *(self.index[s] for s in strategies)))
        self.start = self.best

    @property
    def depth(self) -> int:
        return self.first + len(self.order)

    def outcome(self, key: tuple[int, ...]) -> Outcome:
        """The outcome of ``(batching index, candidate index per group)``, memoised; the
        best met becomes the incumbent."""
        if key not in self.cache:
            self.cache[key] = self.env.evaluate([self.options[i].strategy for i in key[1:]],
                                                self.batchings[key[0]])
            got = self.cache[key]
            if key[0] not in self.best_by or got.reward > self.best_by[key[0]][1]:
                self.best_by[key[0]] = (key, got.reward)
            if self.best is None or got.reward > self.best.reward:
                self.best_key, self.best = key, got
        return self.cache[key]

    def log_ratio(self, outcome: Outcome) -> float:
        """log(effective ms / ref ms): lower is better."""
        return math.log(max(-outcome.reward, 1e-12) / self.ref_ms)

    def complete(self, path: Sequence[int]) -> tuple[int, ...]:
        """``path`` completed, as a key: the decisions it has not taken as in the best
        strategy met with its batching; where none was met yet, as in the incumbent, each
        group whose replicas would hold less than a sample per microbatch on its fastest
        replica alone."""
        b = path[0] if self.first and path else self.best_key[0]
        if b in self.best_by:
            key = list(self.best_by[b][0])
        else:
            m = self.batchings[b].microbatches
            key = [b, *(a if self.fewest[a] >= m else self.alone[a] for a in self.best_key[1:])]
        for k, a in enumerate(path[self.first:]):
            key[1 + self.order[k]] = a
        return tuple(key)

    def decided(self, path: Sequence[int]) -> list[int | None]:
        out: list[int | None] = [None] * len(self.order)
        for k, a in enumerate(path[self.first:]):
            out[self.order[k]] = a
        return out

    def allowed(self, path: Sequence[int]) -> np.ndarray:
        """The actions open after ``path``: every batching; the candidates whose replicas
        hold a sample per microbatch of the batching taken."""
        if len(path) < self.first:
            return np.ones(len(self.batchings), dtype=bool)
        return np.array(self.fewest) >= self.microbatches(path)

    def microbatches(self, path: Sequence[int]) -> int:
        """The microbatch count of the batching ``path`` takes (the incumbent's before)."""
        return self.batchings[path[0] if self.first and path else self.best_key[0]].microbatches

    def expand(self, node: _Node, path: Sequence[int]) -> float:
        """Set the node's priors; return its value (see the module docstring)."""
        rollout = -self.log_ratio(self.outcome(self.complete(path)))
        mask = self.allowed(path)
        if self.net is None or len(path) < self.first:
            prior, value = mask.astype(float), rollout
        else:
            current = self.order[len(path) - self.first]
            data = joint_graph(self.static, self.decided(path), current)
            with torch.no_grad():
                logits, head = self.net(data, current, self.options)
            prior = torch.softmax(logits, dim=0).double().numpy()
            if self.microbatches(path) > 1:  # the network was not shown micro-batched states
                prior = (1 - UNSEEN_UNIFORM) * prior + UNSEEN_UNIFORM / len(prior)
            prior = prior * mask
            value = self.value_weight * -float(head) + (1 - self.value_weight) * rollout
        node.prior = prior / prior.sum()
        node.visits, node.totals, node.value = np.zeros(len(mask)), np.zeros(len(mask)), value
        node.mask = mask
        return value

    def playout(self, root: _Node, committed: list[int]) -> None:
        node, path, trail = root, list(committed), []
        while True:
            if len(path) == self.depth:
                value = -self.log_ratio(self.outcome(self.complete(path)))
                break
            if node.prior is None:
                value = self.expand(node, path)
                break
            a = self._select(node)
            trail.append((node, a))
            path.append(a)
            node = node.children.setdefault(a, _Node())
        self.low, self.high = min(self.low, value), max(self.high, value)
        for parent, a in trail:
            parent.visits[a] += 1
            parent.totals[a] += value

    def _select(self, node: _Node) -> int:
        visited = node.visits > 0
        mean = (node.value + node.totals.sum()) / (1 + node.visits.sum())
        q = np.where(visited, node.totals / np.maximum(node.visits, 1), mean)
        span = max(self.high - self.low, 1e-12)
        u = C_PUCT * node.prior * math.sqrt(max(node.visits.sum(), 1.0)) / (1 + node.visits)
        return int(np.argmax(np.where(node.mask, (q - self.low) / span + u, -np.inf)))

    def add_noise(self, node: _Node, weight: float) -> None:
        if weight > 0 and node.prior is not None:
            noise = self.rng.dirichlet(np.full(len(node.prior), NOISE_ALPHA)) * node.mask
            node.prior = (1 - weight) * node.prior + weight * noise / noise.sum()


def search(env: StrategyEnv, features: GroupGraph, start: Sequence[GroupStrategy], *,
           ref_ms: float, net: JointNet | None = None, playouts: int = 400,
           time_limit_s: float = 60.0, seed: int = 0, value_weight: float = 0.25,
           noise: float = 0.25, choices: Sequence[Batching] = (ONE,),
           seeds: Sequence[tuple[Batching, Sequence[GroupStrategy]]] = ()) -> Search:
    """Search for a batching and a strategy per group from the incumbent (module docstring).

    Parameters
    ----------
    env, features
        The problem and its group features.
    start
        The incumbent to beat, with one microbatch: a ``learned.decoder.candidates``
        strategy per group.
    ref_ms
        The reference time of the value scale (> 0).
    net
        The joint-graph network for priors and values; None: uniform priors, rollout values.
    playouts, time_limit_s
        Playouts in all (at least one per decision), and a CPU-time safety net.
    value_weight, noise
        The value head's share of a leaf's value; the Dirichlet noise's share of the root priors.
    choices
        The batchings the first decision chooses among (``batching.batchings``); with one,
        there is no such decision and every strategy runs with it.
    seeds
        More incumbents, ``(batching, strategy per group)``, as ``seeds.seed_of_plan``
        makes from other planners' plans; their strategies join the candidates.
    """
    tree = _Tree(env, features, net, [(ONE if len(choices) > 1 else choices[0], start), *seeds],
                 choices, ref_ms, value_weight, seed)
    first = math.ceil(playouts * BATCHING_SHARE) if tree.first else 0
    per_decision = max(1, math.ceil((playouts - first) / len(tree.order)))
    budgets = [max(first, per_decision)] * tree.first + [per_decision] * len(tree.order)
    deadline = time.process_time() + time_limit_s
    root, committed, pending, spent, stopped = _Node(), [], [], 0, False
    with one_thread():
        for budget in budgets:
            for p in range(budget):
                if time.process_time() > deadline:
                    stopped = True
                    break
                tree.playout(root, committed)
                spent += 1
                if p == 0:
                    tree.add_noise(root, noise)
            if stopped or root.visits is None or root.visits.sum() == 0:
                stopped = stopped or root.visits is None
                break
            if len(committed) < tree.first:  # the batching whose best strategy met is best
                met = [tree.best_by[b][1] if b in tree.best_by else -math.inf
                       for b in range(len(tree.batchings))]
                a = int(np.lexsort((np.arange(len(met)), -root.visits, -np.array(met)))[0])
            else:
                mean = root.totals / np.maximum(root.visits, 1)
                a = int(np.lexsort((np.arange(len(mean)), -mean, -root.visits))[0])
            if len(committed) >= tree.first:
                pending.append((tuple(tree.decided(committed)),
                                tree.order[len(committed) - tree.first],
                                tuple(float(v) for v in root.visits / root.visits.sum())))
            committed.append(a)
            root = root.children.setdefault(a, _Node())
    samples: tuple[Sample, ...] = ()
    if len(committed) == tree.depth:
        final = tree.log_ratio(tree.outcome(tree.complete(committed)))
        samples = tuple(Sample(decided=d, current=c, visits=v, log_ratio=final) for d, c, v in pending)
    return Search(strategies=tuple(tree.options[i].strategy for i in tree.best_key[1:]),
                  batching=tree.batchings[tree.best_key[0]], outcome=tree.best, start=tree.start,
                  order=tree.order, playouts=spent, evaluations=len(tree.cache), samples=samples,
                  stopped_by_time=stopped)
