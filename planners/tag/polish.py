"""Refinement of TAG's search result: boundary and single-group moves, then the batching
with the placement repaired for it, in turn.

Method: first-improvement hill climbing on the simulator at the search's batching. A
sweep visits the groups in order and tries, for each, first the **boundary moves** (the
group takes its predecessor's or its successor's strategy: a pipeline stage boundary
moves by one op group, whatever the strategies, seeds' replica sets included), then
every other **option**: HeteroG's candidates (``learned.decoder.candidates``), the
strategies the current placement and ``extra`` (the seeds') use, and each replica set's
other batch balance (even or speed-proportional). A move is kept as soon as the reward
improves by more than a relative ``IMPROVEMENT`` (so ties never cycle); sweeps repeat
until one makes no move. Then every other batching among ``choices`` is simulated twice:
with the climbed groups as they are, and **repaired** for its microbatch count (each
replicated group whose least replica would hold fewer samples than microbatches takes
its even-balance variant where that holds enough, else its fastest replica alone), so a
microbatch count changes jointly with the placements it needs. Where one is faster, it
is taken and the groups are climbed again at it. Rounds repeat until the batching stays,
within ``max_evaluations`` simulations in all (deterministic) and ``time_limit_s`` CPU
seconds (a safety net).

Returns the best strategy met, never worse than the start. Complexity per sweep:
groups x (2 + options) simulations; per batching round, 2 x batchings.

Limits: single-group moves only (no two groups changed at once but by the repair); the
stage boundaries are op-group boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..base import device_speeds
from ..learned.decoder import candidates
from ..learned.env import GroupStrategy, Outcome
from .batching import BatchedEnv, Batching

IMPROVEMENT = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class Polished:
    """The refined strategy, its batching and outcome, and the simulations spent."""

    strategies: tuple[GroupStrategy, ...]
    batching: Batching
    outcome: Outcome
    evaluations: int


class _Budget:
    def __init__(self, evaluations: int, time_limit_s: float):
        self.left, self.deadline = evaluations, time.process_time() + time_limit_s

    def spend(self) -> bool:
        """Take one simulation; False where none is left."""
        if self.left <= 0 or time.process_time() > self.deadline:
            return False
        self.left -= 1
        return True


def polish(env: BatchedEnv, strategies: Sequence[GroupStrategy], batching: Batching,
           choices: Sequence[Batching], *, max_evaluations: int = 1000,
           time_limit_s: float = 30.0, extra: Sequence[GroupStrategy] = ()) -> Polished:
    """Climb ``strategies`` at ``batching``, then the batching among ``choices`` with the
    placement repaired for it, in turn (module docstring)."""
    budget = _Budget(max_evaluations, time_limit_s)
    current = tuple(strategies)
    budget.spend()
    best = env.evaluate(current, batching)
    tried: set[Batching] = set()
    wide = options(env, [*current, *extra])
    full = False  # boundary moves only until the batching stays, then every option
    while True:
        tried.add(batching)
        current, best = climb(env, current, batching, best, wide if full else (), budget)
        moved = None
        for other in choices:
            if other in tried:
                continue
            for trial in dict.fromkeys([current, repaired(env, current, other.microbatches)]):
                if not budget.spend():
                    break
                outcome = env.evaluate(trial, other)
                if outcome.reward > best.reward + IMPROVEMENT * abs(best.reward):
                    moved, best, current = other, outcome, trial
        if moved is None:
            if full or budget.left <= 0:
                return Polished(strategies=current, batching=batching, outcome=best,
                                evaluations=max_evaluations - budget.left)
            full, tried = True, set()
            continue
        batching = moved


def options(env: BatchedEnv, used: Sequence[GroupStrategy]) -> list[GroupStrategy]:
    """HeteroG's candidates, then the strategies in ``used`` and every replica set's other
    balance, each once."""
    out = [c.strategy for c in candidates(env.cm.cluster)]
    for s in used:
        out.append(s)
        if len(s.devices) > 1:
            out.append(replace(s, balance="even" if s.balance == "proportional" else "proportional"))
    return list(dict.fromkeys(out))


def climb(env: BatchedEnv, start: tuple[GroupStrategy, ...], batching: Batching, best: Outcome,
          moves: Sequence[GroupStrategy], budget: _Budget) -> tuple[tuple[GroupStrategy, ...], Outcome]:
    """First-improvement hill climbing by boundary, then single-group moves (module
    docstring); returns the best strategy met and its outcome."""
    current = list(start)
    moved = True
    while moved:
        moved = False
        for g in range(len(current)):
            near = [current[k] for k in (g - 1, g + 1) if 0 <= k < len(current)]
            for option in dict.fromkeys([*near, *moves]):
                if option == current[g]:
                    continue
                if not budget.spend():
                    return tuple(current), best
                trial = [*current[:g], option, *current[g + 1:]]
                outcome = env.evaluate(trial, batching)
                if outcome.reward > best.reward + IMPROVEMENT * abs(best.reward):
                    current, best, moved = trial, outcome, True
    return tuple(current), best


def repaired(env: BatchedEnv, strategies: Sequence[GroupStrategy],
             microbatches: int) -> tuple[GroupStrategy, ...]:
    """``strategies`` with each replicated group whose least replica holds fewer than
    ``microbatches`` samples changed to its even-balance variant where that holds enough,
    else to its fastest replica alone."""
    speed = dict(zip(env.env.devices, device_speeds(env.cm, env.env.devices)))
    out = []
    for i, s in enumerate(strategies):
        for trial in (s, replace(s, balance="even")):
            if _fewest(env, i, trial) >= microbatches:
                out.append(trial)
                break
        else:
            out.append(GroupStrategy(devices=(max(s.devices, key=lambda d: speed[d]),)))
    return tuple(out)


def _fewest(env: BatchedEnv, index: int, strategy: GroupStrategy) -> float:
    """Samples of the least replica of ``strategy`` for op group ``index`` (the whole
    batch for one device)."""
    group = env.env.group_of(index, strategy)
    if len(group.devices) == 1:
        return env.batch_size
    return min(round(x * env.batch_size) for x in group.shares)
