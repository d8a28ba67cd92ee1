"""Combinatorial refinement of a decoded strategy: local search with the simulator.

HeteroG refines the strategy its policy decodes by searching nearby strategies on its
simulator. Method here: first-improvement hill climbing over single-group moves. A
sweep visits the groups in order and, for each, tries every other candidate strategy
(``decoder.candidates``) with the rest fixed, keeping a move as soon as the
environment's reward improves (by more than a relative ``1e-9``, so ties never cycle).
Sweeps repeat until one makes no move (a local optimum: no single group's change helps)
or the budget runs out: ``max_evaluations`` simulations (deterministic), and
``time_limit_s`` of process CPU time (a safety net; where it stops the search, the
result can depend on the machine's speed).

Returns the best strategy met, never worse than the start. Complexity per sweep:
groups x candidates simulations.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from .decoder import candidates
from .env import GroupStrategy, Outcome, StrategyEnv

IMPROVEMENT = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class Refinement:
    """The refined strategy, its outcome, and what the search spent."""

    strategies: tuple[GroupStrategy, ...]
    outcome: Outcome
    start: Outcome
    evaluations: int
    sweeps: int
    local_optimum: bool  # the last sweep made no move (the budget did not stop it)


def refine(env: StrategyEnv, start: Sequence[GroupStrategy], *, max_evaluations: int = 2000,
           time_limit_s: float = 30.0) -> Refinement:
    """Hill-climb from ``start`` by single-group moves (see the module docstring)."""
    options = [c.strategy for c in candidates(env.cm.cluster)]
    current = list(start)
    best = first = env.evaluate(current)
    evaluations, sweeps = 1, 0
    deadline = time.process_time() + time_limit_s
    while True:
        sweeps += 1
        moved = False
        for g in range(len(current)):
            for option in options:
                if option == current[g]:
                    continue
                if evaluations >= max_evaluations or time.process_time() > deadline:
                    return Refinement(strategies=tuple(current), outcome=best, start=first,
                                      evaluations=evaluations, sweeps=sweeps, local_optimum=False)
                trial = [*current[:g], option, *current[g + 1:]]
                outcome = env.evaluate(trial)
                evaluations += 1
                if outcome.reward > best.reward + IMPROVEMENT * abs(best.reward):
                    current, best, moved = trial, outcome, True
        if not moved:
            return Refinement(strategies=tuple(current), outcome=best, start=first,
                              evaluations=evaluations, sweeps=sweeps, local_optimum=True)
