"""Training a strategy policy on the environment by REINFORCE with a baseline.

Method (as HeteroG trains its policy): each step runs one episode of every problem (a
``StrategyEnv`` with its ``GroupGraph``): sample a strategy for every group from the
policy, score it on the simulator (``StrategyEnv.evaluate``), and weigh the
log-probability of what was sampled by the reward's advantage over that problem's
moving-average baseline (the baseline before this episode), divided by the baseline's
magnitude and clipped to +-1, so that problems whose iteration times differ by orders
of magnitude, or whose bad strategies are catastrophically slow, pull with comparable
force; the summed loss takes one Adam step. One step per problem visited, rather than
one per episode, is what lets one policy learn problems whose best strategies differ
(alternating single-episode steps oscillated between them). Seeded: the same problems, initial weights, seed and
episode count give the same weights and rewards.

Self-imitation (Oh et al., ICML 2018), optional: with ``imitation_weight`` > 0 the loss
also raises the log-probability of the best strategy known for each problem so far (a
given start, as a refined strategy, or the best sampled), so what search found is
learned rather than only what sampling stumbles on.

The network is small, so training runs torch on one thread (restored afterwards): on a
loaded two-core machine more threads only contend, tens of times slower.

Complexity: ``episodes`` x (one encoder pass and backward + one simulation).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from dl_nfv.artifacts import BadInput

from .decoder import StrategyPolicy, candidates
from .env import GroupStrategy, Outcome, StrategyEnv
from .features import GroupGraph

ADVANTAGE_CLIP = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One (graph, cluster) to train on: its environment and its features."""

    env: StrategyEnv
    graph: GroupGraph


@dataclass(frozen=True, kw_only=True, slots=True)
class Training:
    """What training did on one problem: the best strategy sampled, every reward."""

    best: tuple[GroupStrategy, ...]
    best_outcome: Outcome
    rewards: tuple[float, ...]


def reinforce(policy: StrategyPolicy, problems: Sequence[Problem], *, episodes: int,
              seed: int = 0, learning_rate: float = 0.01, baseline_decay: float = 0.9,
              starts: Sequence[Sequence[GroupStrategy] | None] | None = None,
              imitation_weight: float = 0.0) -> tuple[Training, ...]:
    """Train ``policy`` over ``problems`` in turn for ``episodes`` episodes in all.

    ``starts`` (optional, one per problem, ``None`` for none): a known strategy of each
    problem, every group's strategy one of its candidates, that counts as the best so
    far; ``imitation_weight``: the weight of the self-imitation term (module docstring).

    Returns one ``Training`` per problem (in order). Raises ``BadInput`` for no problems,
    fewer episodes than problems, or a start that is not made of candidates.
    """
    if not problems:
        raise BadInput("training needs at least one problem")
    if episodes < len(problems):
        raise BadInput(f"{episodes} episodes cannot visit {len(problems)} problems")
    with one_thread():
        return _train(policy, problems, episodes=episodes, seed=seed,
                      learning_rate=learning_rate, baseline_decay=baseline_decay,
                      starts=starts or [None] * len(problems), imitation_weight=imitation_weight)


def _known(problem: Problem, choices, start) -> tuple[torch.Tensor, tuple, Outcome] | None:
    """A start as (candidate indices, strategies, outcome), or None."""
    if start is None:
        return None
    index = {c.strategy: i for i, c in enumerate(choices)}
    missing = next((s for s in start if s not in index), None)
    if missing is not None:
        raise BadInput(f"a training start's strategy {missing} is not a candidate")
    strategies = tuple(start)
    picks = torch.tensor([index[s] for s in strategies], dtype=torch.long)
    return picks, strategies, problem.env.evaluate(strategies)


def _train(policy: StrategyPolicy, problems: Sequence[Problem], *, episodes: int, seed: int,
           learning_rate: float, baseline_decay: float, starts, imitation_weight: float
           ) -> tuple[Training, ...]:
    options = [candidates(p.env.cm.cluster) for p in problems]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    baselines: list[float | None] = [None] * len(problems)
    known = [_known(p, o, s) for p, o, s in zip(problems, options, starts)]
    best: list[tuple[tuple[GroupStrategy, ...], Outcome] | None] = [
        None if k is None else (k[1], k[2]) for k in known]
    best_picks: list[torch.Tensor | None] = [None if k is None else k[0] for k in known]
    rewards: list[list[float]] = [[] for _ in problems]
    for start in range(0, episodes, len(problems)):
        loss = torch.zeros(())
        for k in range(min(len(problems), episodes - start)):
            problem, choices = problems[k], options[k]
            logits = policy(problem.graph, choices)
            picks = torch.multinomial(torch.softmax(logits.detach(), dim=1), 1,
                                      generator=generator).squeeze(1)
            strategies = tuple(choices[int(i)].strategy for i in picks)
            outcome = problem.env.evaluate(strategies)
            rewards[k].append(outcome.reward)
            if best[k] is None or outcome.reward > best[k][1].reward:
                best[k], best_picks[k] = (strategies, outcome), picks
            advantage = _advantage(outcome.reward, baselines[k])
            baselines[k] = outcome.reward if baselines[k] is None else (
                baseline_decay * baselines[k] + (1 - baseline_decay) * outcome.reward)
            dist = torch.distributions.Categorical(logits=logits)
            loss = loss - advantage * dist.log_prob(picks).sum()
            if imitation_weight > 0:
                loss = loss - imitation_weight * dist.log_prob(best_picks[k]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return tuple(Training(best=b[0], best_outcome=b[1], rewards=tuple(r))
                 for b, r in zip(best, rewards) if b is not None)


def _advantage(reward: float, baseline: float | None) -> float:
    """The reward over the baseline, relative to the baseline's size, within +-ADVANTAGE_CLIP."""
    if baseline is None:
        return 0.0
    relative = (reward - baseline) / max(abs(baseline), 1e-9)
    return max(-ADVANTAGE_CLIP, min(ADVANTAGE_CLIP, relative))


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch's CPU kernels on one thread for a while, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
