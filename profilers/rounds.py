"""When a profile has timed enough rounds, how much its times spread, and where it runs.

Every timed round times the whole step and every op once. The profile keeps per-op
medians, so what matters is how well a median is known after ``n`` rounds: by the
notch rule of box plots (McGill, Tukey and Larsen 1978), ``median +- 1.57 IQR / sqrt(n)``
is a ~95% interval. A profile adds rounds beyond ``--repeats`` (up to ``MAX_ROUND_FACTOR``
times as many, and for at most ``EXTRA_ROUNDS_S`` of added rounds: on a model whose
round takes many seconds a busy machine would otherwise quadruple the profile, while a
round that long already averages over its many kernels) until

* the median of the per-op sum of a round is known within ``SUM_TOLERANCE`` of itself, and
* the ops whose own median is known no better than ``OP_TOLERANCE`` (noisy ops: tiny
  ops on a busy machine, ops that cross a thread pool's barrier) hold at most
  ``NOISY_SHARE`` of the per-op sum.

The rounds also span at least ``SPAN_S`` of wall time (``--span``; up to
``MAX_SPAN_ROUNDS`` rounds): a shared machine's speed moves over seconds (one model's
one-thread step, timed for a minute, had per-second medians from 6.1 to 8.1 ms, in
spells of several seconds), and rounds that all fall into one spell give that spell's
times, however stable they are. A step of seconds spans this in its ``--repeats``
rounds; a step of milliseconds runs hundreds of rounds, whose medians are the machine
over those seconds, as a training run's steps are.

Each added round re-times every op (a step cannot run some ops alone), so the noisy
ops are re-measured together with the rest. The spread recorded in ``ProfileInfo`` is
the interquartile range over the median, of the round sums, of the whole steps and
(time-weighted median over ops) of each op.

Threads are pinned as the runtime pins a worker: ``n`` threads on the first ``n`` CPUs
this process may use (``runtime.inputs.cpu_set``), inter-op threads left as they are.
Limits: with fewer than 3 rounds the interquartile range says little, so such a
profile counts as unstable until it has 3; the rule judges the medians, not whether
another minute of the machine would give the same ones (a shared machine drifts).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

NOTCH = 1.57
SUM_TOLERANCE = 0.02
OP_TOLERANCE = 0.10
NOISY_SHARE = 0.10
MAX_ROUND_FACTOR = 4
EXTRA_ROUNDS_S = 20.0
SPAN_S = 3.0
MAX_SPAN_ROUNDS = 1000


def round_indices(repeats: int, stable: Callable[[], bool], clock=time.perf_counter,
                  span_s: float = 0.0) -> Iterator[int]:
    """The rounds to time: ``repeats``, and more until they span ``span_s`` of ``clock``
    (up to ``MAX_SPAN_ROUNDS``), then more while ``stable()`` (the rounds so far) is false,
    up to ``MAX_ROUND_FACTOR x repeats`` in all and while the rounds added for it have
    taken at most ``EXTRA_ROUNDS_S`` (module doc)."""
    began, added_from = clock(), None
    r = 0
    while True:
        if r >= repeats and not (clock() - began < span_s and r < MAX_SPAN_ROUNDS):
            if r >= MAX_ROUND_FACTOR * repeats:
                return
            added_from = clock() if added_from is None else added_from
            if stable() or clock() - added_from > EXTRA_ROUNDS_S:
                return
        yield r
        r += 1


def relative_iqr(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than 2 values or a zero median)."""
    if len(values) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def median_uncertainty(values: Sequence[float]) -> float:
    """Half-width of the notch around the median, relative to it (inf below 3 values)."""
    if len(values) < 3:
        return math.inf
    return NOTCH * relative_iqr(values) / math.sqrt(len(values))


@dataclass(frozen=True, slots=True)
class Stability:
    """How well the rounds so far pin the medians down (see the module doc)."""

    sum_uncertainty: float  # of the per-op sum's median, relative
    noisy_share: float  # of the per-op sum, in ops whose median is uncertain by > OP_TOLERANCE
    sum_spread: float  # relative IQR of the round sums
    op_spread: float  # time-weighted median over ops of their relative IQR

    @property
    def stable(self) -> bool:
        return self.sum_uncertainty <= SUM_TOLERANCE and self.noisy_share <= NOISY_SHARE


def stability(fwd_runs: Mapping[str, Sequence[float]], bwd_runs: Mapping[str, Sequence[float]],
              ops: Sequence[str]) -> Stability:
    """``Stability`` of per-op times, one value per round in ``fwd_runs[op]`` and
    ``bwd_runs[op]`` (seconds). O(ops x rounds log rounds)."""
    rounds = min((len(fwd_runs.get(o, ())) for o in ops), default=0)
    if rounds == 0:
        return Stability(math.inf, 1.0, 0.0, 0.0)
    per_op = {o: [fwd_runs[o][k] + bwd_runs[o][k] for k in range(rounds)] for o in ops}
    sums = [sum(per_op[o][k] for o in ops) for k in range(rounds)]
    medians = {o: statistics.median(v) for o, v in per_op.items()}
    total = sum(medians.values())
    if total <= 0:
        return Stability(0.0, 0.0, 0.0, 0.0)
    noisy = sum(medians[o] for o in ops if median_uncertainty(per_op[o]) > OP_TOLERANCE)
    spreads = sorted((relative_iqr(per_op[o]), medians[o]) for o in ops)
    acc, op_spread = 0.0, 0.0
    for spread, weight in spreads:  # weighted median
        acc += weight
        if acc >= total / 2:
            op_spread = spread
            break
    return Stability(median_uncertainty(sums), noisy / total, relative_iqr(sums), op_spread)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, in order (empty where the OS does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pin(threads: int, cpus: Sequence[int]) -> tuple[int, ...]:
    """Pin this process to ``threads`` of ``cpus`` as the runtime pins a worker of that many
    threads (``cpu_set``: the first block); returns the CPUs pinned to (empty: not pinned,
    more threads than CPUs)."""
    from dl_nfv.runtime.inputs import cpu_set  # the runtime's rule, one copy of it

    chosen = cpu_set([threads], 0, list(cpus)) if cpus else ()
    if chosen:
        os.sched_setaffinity(0, chosen)
    return chosen
