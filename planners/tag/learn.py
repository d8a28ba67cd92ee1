"""Training TAG's joint-graph network from its own searches, AlphaZero-style.

Method (after Silver et al., "Mastering the game of Go without human knowledge", 2017):
each iteration runs one tree search (``tag.mcts.search``, priors and values from the
current network, Dirichlet noise at each root, seeded) on every (graph, topology)
problem; each committed decision of a search leaves a sample (the partial placement,
the group decided, the visit distribution over its candidates, and the log of the
finished strategy's simulated time relative to the best DP baseline). The samples go
into a replay buffer of the most recent ``buffer`` samples, and ``updates`` Adam steps
on minibatches of ``batch`` samples drawn from it (seeded) train

* the policy head on the visit distribution (cross-entropy), and
* the value head on the simulated outcome (squared error, in log units),

``loss = CE(visits, softmax(logits)) + (value - log_ratio)^2``, averaged over the batch.

Problems: every graph on every topology; topologies may be files or ``random:N`` specs
(``tag.topogen``). Each problem's incumbent is the planner's (``heterog.better_start``
of the greedy start) and its reference the best DP baseline's simulated time (the
incumbent's where no DP baseline fits). The searches decide placements with one
microbatch (the planner's first decision, the batching, takes no policy); training
starts from fresh seeded weights, or from a given policy's (fine-tuning, ``init``).

The network is small and graphs differ per sample, so training runs torch on one thread.
Seeded: the same problems, seed and budgets give the same weights (no CPU time limit
is applied to the searches). Complexity per iteration: problems x playouts x (network
pass + simulation) for the searches, ``updates`` x ``batch`` network passes and backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dl_nfv.artifacts import BadInput, OpGraph, Topology
from dl_nfv.artifacts.policy import Policy, TrainedOn

from ..heterog import best_baseline, better_start, greedy_start, problem_of
from ..learned.decoder import candidates
from ..learned.policy import policy_of
from ..learned.reinforce import Problem, one_thread
from .joint import JointNet, JointStatic, joint_graph
from .mcts import Sample, search
from .planner import ARCHITECTURE, DEFAULT_GROUPS, PLANNER, load_net, new_net


def learn(pairs: Sequence[tuple[str, OpGraph]], topologies: Sequence[tuple[str, Topology]], *,
          iterations: int, playouts: int = 128, seed: int = 0, groups: int = DEFAULT_GROUPS,
          updates: int = 4, batch: int = 32, buffer: int = 4096, lr: float = 3e-3,
          command: str = "", progress: Callable[[str], None] | None = None,
          init: Policy | None = None) -> Policy:
    """Train a TAG policy over every (graph, topology) pair (module docstring).

    Parameters
    ----------
    pairs, topologies
        ``(name, artifact)`` of each graph and each topology.
    iterations
        Rounds of (one search per problem, ``updates`` training steps); >= 1.
    playouts
        Playouts per search (>= 1).
    seed
        Seeds the initial weights, the searches' noise and the minibatches.
    groups, updates, batch, buffer, lr
        Coarsening target; Adam steps per iteration, samples per step, replay size, rate.
    command, progress
        The command line recorded in the policy; a callback for a line per iteration.
    init
        A TAG policy whose weights training starts from (fine-tuning); None: fresh
        weights from ``seed``.
    """
    if not pairs or not topologies:
        raise BadInput("training needs at least one graph and one topology")
    if iterations < 1 or playouts < 1:
        raise BadInput(f"training needs iterations and playouts of at least 1, got "
                       f"{iterations} and {playouts}")
    problems = [_setup(graph, topology, groups) for _, graph in pairs for _, topology in topologies]
    names = [f"{g} on {t}" for g, _ in pairs for t, _ in topologies]
    net = new_net(seed) if init is None else load_net(init)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    replay: list[tuple[int, Sample]] = []
    with one_thread():
        for it in range(iterations):
            net.eval()
            ratios = []
            for k, (problem, start, ref_ms, _) in enumerate(problems):
                found = search(problem.env, problem.graph, start, ref_ms=ref_ms, net=net,
                               playouts=playouts, time_limit_s=math.inf,
                               seed=seed * 1_000_003 + it * len(problems) + k)
                replay += [(k, s) for s in found.samples]
                ratios.append(found.outcome.iteration_ms / ref_ms)
            replay = replay[-buffer:]
            net.train()
            loss = sum(_step(net, optimizer, problems, replay, rng, batch) for _ in range(updates))
            if progress is not None:
                best = min(range(len(ratios)), key=ratios.__getitem__)
                progress(f"iteration {it + 1}/{iterations}: loss {loss / updates:.3f}, mean "
                         f"time / best DP {np.mean(ratios):.3f} (best {ratios[best]:.3f}, "
                         f"{names[best]})")
    net.eval()
    trained_on = TrainedOn(graphs=tuple(n for n, _ in pairs),
                           topologies=tuple(n for n, _ in topologies), episodes=iterations,
                           max_devices=max(len(p[0].env.devices) for p in problems))
    return policy_of(net, planner=PLANNER, architecture=ARCHITECTURE, trained_on=trained_on,
                     seed=seed, command=command)


def _setup(graph: OpGraph, topology: Topology, groups: int):
    """``(problem, incumbent, reference ms, joint-graph statics)`` of one pair."""
    problem: Problem = problem_of(graph, topology, groups=groups)
    env = problem.env
    start, _ = better_start(env, greedy_start(env), "greedy")
    baseline = best_baseline(graph, topology, env.optimizer.value)
    ref_ms = (baseline.prediction.iteration_ms if baseline is not None
              else -env.evaluate(start).reward)
    return problem, start, ref_ms, JointStatic(problem.graph, candidates(env.cm.cluster))


def _step(net: JointNet, optimizer: torch.optim.Optimizer, problems, replay, rng, batch: int) -> float:
    """One Adam step on a minibatch from the replay buffer; returns its mean loss."""
    if not replay:
        return 0.0
    picks = rng.choice(len(replay), size=min(batch, len(replay)), replace=False)
    loss = torch.zeros(())
    for i in sorted(picks.tolist()):
        k, sample = replay[i]
        static = problems[k][3]
        logits, value = net(joint_graph(static, sample.decided, sample.current), sample.current,
                            static.options)
        target = torch.tensor(sample.visits, dtype=torch.float32)
        loss = loss - (target * torch.log_softmax(logits, dim=0)).sum() + (value - sample.log_ratio) ** 2
    loss = loss / len(picks)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())
