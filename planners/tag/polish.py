"""Refinement of TAG's search result: single-group moves, then the batching, in turn.

Method: HeteroG's hill climbing over single-group moves (``learned.refine``) at the
search's batching; then every other batching (``batching.batchings``) with the refined
groups, simulated; where one is faster, it is taken and the groups are refined again
at it. Rounds repeat until the batching stays, within ``max_evaluations`` simulations
in all (deterministic) and ``time_limit_s`` CPU seconds (a safety net).

Returns the best strategy met, never worse than the start. Complexity: ``max_evaluations``
simulations at most.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..learned.env import GroupStrategy, Outcome
from ..learned.refine import IMPROVEMENT, refine
from .batching import BatchedEnv, Batching


@dataclass(frozen=True, kw_only=True, slots=True)
class Polished:
    """The refined strategy, its batching and outcome, and the simulations spent."""

    strategies: tuple[GroupStrategy, ...]
    batching: Batching
    outcome: Outcome
    evaluations: int


def polish(env: BatchedEnv, strategies: Sequence[GroupStrategy], batching: Batching,
           choices: Sequence[Batching], *, max_evaluations: int = 1000,
           time_limit_s: float = 30.0) -> Polished:
    """Refine ``strategies`` at ``batching``, then the batching among ``choices``, in turn
    (module docstring)."""
    deadline = time.process_time() + time_limit_s
    current, spent = tuple(strategies), 0
    tried: set[Batching] = set()
    while True:
        tried.add(batching)
        got = refine(env.at(batching), current, max_evaluations=max(1, max_evaluations - spent),
                     time_limit_s=max(0.0, deadline - time.process_time()))
        current, best, spent = got.strategies, got.outcome, spent + got.evaluations
        moved = None
        for other in choices:
            if other in tried or spent >= max_evaluations or time.process_time() > deadline:
                continue
            outcome = env.evaluate(current, other)
            spent += 1
            if outcome.reward > best.reward + IMPROVEMENT * abs(best.reward):
                moved, best = other, outcome
        if moved is None:
            return Polished(strategies=current, batching=batching, outcome=best, evaluations=spent)
        batching = moved
