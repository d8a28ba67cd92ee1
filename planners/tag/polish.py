"""Refinement of TAG's search result: stage cuts and single-group moves, then the batching
with the placement repaired for it, in turn; last, the result at every batching.

Method: hill climbing on the simulator at the search's batching, in two kinds of move.

* **Cut placement.** The runs of consecutive op groups with one strategy are the
  pipeline's stages; each boundary between two runs is in turn simulated at every other
  position from the first run's first group to the second run's end (either run may
  vanish) and placed at the best (an exact line search over one cut: the time as a
  function of a cut is not unimodal, since the bytes crossing it vary along the model,
  e.g. falling after each pooling layer of a CNN, so moving a cut one group at a time
  stops at the first local optimum). Sweeps over the boundaries repeat until none moves.
* **Single-group moves**, first improvement: each group in order tries every
  **option**: HeteroG's candidates (``learned.decoder.candidates``), the strategies the
  current placement and ``extra`` (the seeds') use, and each replica set's other batch
  balance (even or speed-proportional).

A move is kept where the reward improves by more than a relative ``IMPROVEMENT`` (so
ties never cycle); the climb alternates cut placement and a sweep of single-group moves
until the sweep moves nothing. Then every other batching among ``choices`` is simulated
twice: with the climbed groups as they are, and **repaired** for its microbatch count
(each replicated group whose least replica would hold fewer samples than microbatches
takes its even-balance variant where that holds enough, else its fastest replica alone),
so a microbatch count changes jointly with the placements it needs. Where one is faster,
it is taken and the groups are climbed again at it. Cut placement alone is climbed until
the batching stays, then both kinds of move, until the batching stays again. Last, the
result is simulated at every batching (a simulation a batching is held back for this),
so the final placement always gets its best microbatch count and schedule. Within
``max_evaluations`` distinct simulations in all (memoised; deterministic) and
``time_limit_s`` CPU seconds (a safety net).

Returns the best strategy met, never worse than the start. Complexity: per cut sweep
about 2 x groups simulations; per single-group sweep, groups x options; per batching
round, 2 x batchings.

Limits: no two groups changed at once but by a cut or the repair; the stage boundaries
are op-group boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..base import device_speeds
from ..learned.decoder import candidates
from ..learned.env import GroupStrategy, Outcome
from .batching import BatchedEnv, Batching, runs

IMPROVEMENT = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class Polished:
    """The refined strategy, its batching and outcome, and the simulations spent."""

    strategies: tuple[GroupStrategy, ...]
    batching: Batching
    outcome: Outcome
    evaluations: int


class _Budget:
    """The simulations left, memoised: a strategy already simulated at a batching costs
    nothing; ``reserve`` simulations are kept back until ``release``."""

    def __init__(self, env: BatchedEnv, evaluations: int, time_limit_s: float, reserve: int = 0):
        self.env = env
        self.reserve = max(0, min(reserve, evaluations - 1))  # the first simulation is never held
        self.left = evaluations - self.reserve
        self.deadline = time.process_time() + time_limit_s
        self.memo: dict[tuple[tuple[GroupStrategy, ...], Batching], Outcome] = {}

    def release(self) -> None:
        self.left, self.reserve = self.left + self.reserve, 0

    @property
    def spent(self) -> int:
        return len(self.memo)

    def evaluate(self, strategies: Sequence[GroupStrategy], batching: Batching) -> Outcome | None:
        """The outcome of ``strategies`` at ``batching``; None where no simulation is left."""
        key = (tuple(strategies), batching)
        if key not in self.memo:
            if self.left <= 0 or time.process_time() > self.deadline:
                return None
            self.left -= 1
            self.memo[key] = self.env.evaluate(key[0], batching)
        return self.memo[key]


def _better(outcome: Outcome | None, best: Outcome) -> bool:
    return outcome is not None and outcome.reward > best.reward + IMPROVEMENT * abs(best.reward)


def polish(env: BatchedEnv, strategies: Sequence[GroupStrategy], batching: Batching,
           choices: Sequence[Batching], *, max_evaluations: int = 1000,
           time_limit_s: float = 30.0, extra: Sequence[GroupStrategy] = ()) -> Polished:
    """Climb ``strategies`` at ``batching``, then the batching among ``choices`` with the
    placement repaired for it, in turn; last, the result at every batching (module
    docstring)."""
    budget = _Budget(env, max(1, max_evaluations), time_limit_s, reserve=len(choices))
    current = tuple(strategies)
    best = budget.evaluate(current, batching)
    assert best is not None  # the first simulation is always within the budget
    tried: set[Batching] = set()
    wide = options(env, [*current, *extra])
    full = False  # cut moves only until the batching stays, then every option
    while True:
        tried.add(batching)
        current, best = climb(current, batching, best, wide if full else (), budget)
        moved = None
        for other in choices:
            if other in tried:
                continue
            for trial in dict.fromkeys([current, repaired(env, current, other.microbatches)]):
                outcome = budget.evaluate(trial, other)
                if _better(outcome, best):
                    moved, best, current = other, outcome, trial
        if moved is None:
            if full or budget.left <= 0:
                break
            full, tried = True, set()
            continue
        batching = moved
    budget.release()
    for other in choices:  # the result at every batching (memoised where already met)
        outcome = budget.evaluate(current, other)
        if _better(outcome, best):
            batching, best = other, outcome
    return Polished(strategies=current, batching=batching, outcome=best,
                    evaluations=budget.spent)


def options(env: BatchedEnv, used: Sequence[GroupStrategy]) -> list[GroupStrategy]:
    """HeteroG's candidates, then the strategies in ``used`` and every replica set's other
    balances (even, speed-proportional; a seed's given shares are kept only as it has
    them), each once."""
    out = [c.strategy for c in candidates(env.cm.cluster)]
    for s in used:
        out.append(s)
        if len(s.devices) > 1:
            out += [s.rebalanced(b) for b in ("even", "proportional") if b != s.balance]
    return list(dict.fromkeys(out))


def climb(start: tuple[GroupStrategy, ...], batching: Batching, best: Outcome,
          moves: Sequence[GroupStrategy], budget: _Budget) -> tuple[tuple[GroupStrategy, ...], Outcome]:
    """Cut moves, then first-improvement single-group moves over ``moves``, in turn, until
    neither helps (module docstring); returns the best strategy met and its outcome."""
    current = tuple(start)
    while True:
        current, best, _ = place_cuts(current, batching, best, budget)
        current, best, moved = _single(current, batching, best, moves, budget)
        if not moved or budget.left <= 0:
            return current, best


def place_cuts(start: tuple[GroupStrategy, ...], batching: Batching, best: Outcome,
               budget: _Budget) -> tuple[tuple[GroupStrategy, ...], Outcome, bool]:
    """Each stage boundary in turn placed at its best position between its neighbours,
    until a sweep moves none; returns the strategy, its outcome and whether any moved."""
    current, moved_any = start, False
    moved = True
    while moved:
        moved = False
        for k in range(len(runs(current)) - 1):
            spans = runs(current)
            if k + 1 >= len(spans):
                break
            found = None
            for trial in cut_moves(current, spans[k], spans[k + 1]):
                outcome = budget.evaluate(trial, batching)
                if outcome is None:
                    return found or current, best, moved_any or found is not None
                if _better(outcome, best):
                    found, best = trial, outcome
            if found is not None:
                current, moved, moved_any = found, True, True
    return current, best, moved_any


def cut_moves(strategies: Sequence[GroupStrategy], left: range,
              right: range) -> list[tuple[GroupStrategy, ...]]:
    """The boundary between two consecutive runs moved to every other position from the
    left run's first group to the right run's end (either run may vanish)."""
    a, b, c = left.start, right.start, right.stop
    head, tail = tuple(strategies[:a]), tuple(strategies[c:])
    s, t = strategies[a], strategies[b]
    return [(*head, *(s,) * (p - a), *(t,) * (c - p), *tail) for p in range(a, c + 1) if p != b]


def _single(start: tuple[GroupStrategy, ...], batching: Batching, best: Outcome,
            moves: Sequence[GroupStrategy], budget: _Budget) -> tuple[tuple[GroupStrategy, ...], Outcome, bool]:
    """One first-improvement sweep of single-group moves over ``moves``; returns the
    strategy, its outcome and whether any move was kept."""
    current, moved = list(start), False
    for g in range(len(current)):
        for option in moves:
            if option == current[g]:
                continue
            trial = (*current[:g], option, *current[g + 1:])
            outcome = budget.evaluate(trial, batching)
            if outcome is None:
                return tuple(current), best, moved
            if _better(outcome, best):
                current, best, moved = list(trial), outcome, True
    return tuple(current), best, moved


def repaired(env: BatchedEnv, strategies: Sequence[GroupStrategy],
             microbatches: int) -> tuple[GroupStrategy, ...]:
    """``strategies`` with each replicated group whose least replica holds fewer than
    ``microbatches`` samples changed to its even-balance variant where that holds enough,
    else to its fastest replica alone."""
    speed = dict(zip(env.env.devices, device_speeds(env.cm, env.env.devices)))
    out = []
    for i, s in enumerate(strategies):
        for trial in (s, s.rebalanced("even")):
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
