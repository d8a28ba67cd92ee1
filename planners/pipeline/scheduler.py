"""Microbatch scheduling of a synchronous pipeline: fixed orders and a list scheduler.

Input: per stage the forward and backward time of one microbatch (the
slowest replica's), the time of each stage-to-stage transfer of one
microbatch (activations forward, their gradients backward, FIFO on a channel
per stage pair and direction, as links are in the simulator), the time of the
stage's gradient synchronisation and optimizer update after its last
backward, and how many microbatches each stage may hold in flight (memory).

``run`` times a schedule event by event and, for ``Policy.LIST``, builds it:
non-delay list scheduling in which every stage, whenever it is free, starts
the task that can start earliest; between tasks that can both start now it
takes the one with the longer remaining path to the end of the iteration
(forward first, so a bottleneck stage further down is fed), unless the
microbatch cap of the stage is reached or ``backward_first`` is set. The
caps come from memory and from the round trip of a microbatch through the
downstream stages: a stage needs about ``round_trip / (f + b) + 1`` microbatches
in flight not to idle while its gradients travel, which is more than 1F1B's
``stages - s`` when links are slow or stages uneven, and fewer than GPipe's
``m`` when memory is short. ``auto_schedule`` times GPipe, 1F1B and list
variants and keeps the fastest.

Complexity: O(stages^2 x microbatches) per run (each step scans the stages).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dl_nfv.artifacts import Action
from dl_nfv.planners.schedules import Schedule, gpipe, one_f_one_b

INF = float("inf")


class Policy(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    LIST = "list"


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per-microbatch times of a pipeline (all ms); see the module docstring."""

    f_ms: tuple[float, ...]
    b_ms: tuple[float, ...]
    send_ms: dict[tuple[int, int], float]  # (s, t), s < t: one microbatch's activations s -> t
    sync_ms: tuple[float, ...]  # gradient sync + optimizer update after the stage's last B
    caps: tuple[int, ...]  # most microbatches in flight per stage (memory)
    microbatches: int

    @property
    def stages(self) -> int:
        return len(self.f_ms)


@dataclass(frozen=True, slots=True)
class Timed:
    """A timed schedule: the makespan estimate and the order each stage ran."""

    makespan_ms: float
    schedule: Schedule
    label: str


def run(costs: StageCosts, policy: Policy, *, caps: Sequence[int] | None = None,
        backward_first: bool = False) -> Timed:
    """Time (and for ``LIST`` build) a schedule; raises ``ValueError`` if it deadlocks."""
    S, M = costs.stages, costs.microbatches
    if policy is Policy.GPIPE:
        fixed = gpipe(S, M).orders
    elif policy is Policy.ONE_F_ONE_B:
        fixed = one_f_one_b(S, M).orders
    else:
        fixed = None
    cap = list(caps) if caps is not None else [M] * S
    if policy is Policy.LIST:
        cap = [max(1, min(c, M, k)) for c, k in zip(cap, costs.caps)]
    f, b = costs.f_ms, costs.b_ms
    sources: list[list[int]] = [[] for _ in range(S)]  # stages that send to s
    sinks: list[list[int]] = [[] for _ in range(S)]  # stages s sends to
    for (s, t) in costs.send_ms:
        sources[t].append(s)
        sinks[s].append(t)
    # ready times (known once every producer has run), pending producer counts
    ready_f = [[0.0 if s == 0 or not sources[s] else -1.0 for _ in range(M)] for s in range(S)]
    wait_f = [[len(sources[s])] * M for s in range(S)]
    ready_b = [[-1.0] * M for _ in range(S)]
    wait_b = [[len(sinks[s]) + 1] * M for s in range(S)]  # consumers' gradients + own F
    arrive_f: list[list[float]] = [[0.0] * M for _ in range(S)]
    arrive_b: list[list[float]] = [[0.0] * M for _ in range(S)]
    chan_free: dict[tuple[int, int, str], float] = {}
    free = [0.0] * S
    nf = [0] * S  # next forward microbatch (forwards run in microbatch order)
    nb = [0] * S
    pos = [0] * S
    orders: list[list[Action]] = [[] for _ in range(S)]
    last_end = [0.0] * S
    total = 2 * S * M
    done = 0
    while done < total:
        best = None  # (start, stage, op, microbatch)
        for s in range(S):
            choice = _choose(s, fixed, pos, nf, nb, M, cap, ready_f, ready_b, free, f, b,
                             backward_first)
            if choice is not None and (best is None or choice[0] < best[0] - 1e-12):
                best = (choice[0], s, choice[1], choice[2])
        if best is None:
            raise ValueError("the schedule deadlocks")
        start, s, op, m = best
        if op == "F":
            end = start + f[s]
            nf[s] += 1
            for t in sinks[s]:
                key = (s, t, "F")
                arrive = max(end, chan_free.get(key, 0.0)) + costs.send_ms[(s, t)]
                chan_free[key] = arrive
                arrive_f[t][m] = max(arrive_f[t][m], arrive)
                wait_f[t][m] -= 1
                if wait_f[t][m] == 0:
                    ready_f[t][m] = arrive_f[t][m]
            arrive_b[s][m] = max(arrive_b[s][m], end)
            wait_b[s][m] -= 1
            if wait_b[s][m] == 0:
                ready_b[s][m] = arrive_b[s][m]
        else:
            end = start + b[s]
            nb[s] += 1
            for u in sources[s]:
                key = (u, s, "B")
                arrive = max(end, chan_free.get(key, 0.0)) + costs.send_ms[(u, s)]
                chan_free[key] = arrive
                arrive_b[u][m] = max(arrive_b[u][m], arrive)
                wait_b[u][m] -= 1
                if wait_b[u][m] == 0:
                    ready_b[u][m] = arrive_b[u][m]
        free[s] = end
        last_end[s] = end
        pos[s] += 1
        orders[s].append(Action(s, op, m))
        done += 1
    makespan = max(e + sync for e, sync in zip(last_end, costs.sync_ms))
    schedule = Schedule(microbatches=M, orders=tuple(tuple(o) for o in orders))
    label = policy.value if policy is not Policy.LIST else (
        "list-bf" if backward_first else "list") + f"(caps {','.join(map(str, cap))})"
    return Timed(makespan, schedule, label)


def _choose(s, fixed, pos, nf, nb, M, cap, ready_f, ready_b, free, f, b, backward_first):
    """The task stage ``s`` starts next and when, or None while its inputs are unknown."""
    if fixed is not None:
        order = fixed[s]
        if pos[s] >= len(order):
            return None
        a = order[pos[s]]
        r = (ready_f if a.op == "F" else ready_b)[s][a.microbatch]
        if r < 0:
            return None
        return (max(free[s], r), a.op, a.microbatch)
    cands = []
    if nf[s] < M and nf[s] - nb[s] < cap[s]:
        r = ready_f[s][nf[s]]
        if r >= 0:
            cands.append((max(free[s], r), 0 if not backward_first else 1, "F", nf[s]))
    if nb[s] < nf[s]:
        r = ready_b[s][nb[s]]
        if r >= 0:
            cands.append((max(free[s], r), 1 if not backward_first else 0, "B", nb[s]))
    if not cands:
        return None
    # a task with unknown inputs might still become ready before a known one: only
    # commit when no unknown task could precede it (its producers are unscheduled,
    # so it cannot be ready before the earliest start the caller picks)
    start, _, op, m = min(cands)
    return (start, op, m)


def round_trip_caps(costs: StageCosts) -> list[int]:
    """Per stage: microbatches in flight that hide the downstream round trip (>= 1F1B's)."""
    S = costs.stages
    caps = []
    for s in range(S):
        trip = 0.0
        for t in range(s + 1, S):
            trip += costs.f_ms[t] + costs.b_ms[t] + 2 * costs.send_ms.get((t - 1, t), 0.0)
        per = costs.f_ms[s] + costs.b_ms[s]
        need = S - s if per <= 0 else max(S - s, math.ceil(trip / per) + 1)
        caps.append(min(need, costs.microbatches))
    return caps


def auto_schedule(costs: StageCosts, allowed: Sequence[Policy] = tuple(Policy)) -> Timed:
    """The fastest of GPipe, 1F1B and list-scheduled variants that fit the memory caps.

    Ties go to the schedule with fewer microbatches in flight. Deterministic.
    """
    options: list[Timed] = []
    fits_all = all(c >= costs.microbatches for c in costs.caps)
    fits_1f1b = all(c >= min(costs.stages - s, costs.microbatches) for s, c in enumerate(costs.caps))
    if Policy.GPIPE in allowed and fits_all:
        options.append(run(costs, Policy.GPIPE))
    if Policy.ONE_F_ONE_B in allowed and fits_1f1b:
        options.append(run(costs, Policy.ONE_F_ONE_B))
    if Policy.LIST in allowed:
        trip = round_trip_caps(costs)
        seen = set()
        for caps in (trip, list(costs.caps)):
            for bf in (False, True):
                key = (tuple(min(c, k) for c, k in zip(caps, costs.caps)), bf)
                if key in seen:
                    continue
                seen.add(key)
                options.append(run(costs, Policy.LIST, caps=caps, backward_first=bf))
    if not options:
        raise ValueError("no schedule fits the memory of every stage")
    return min(options, key=lambda t: (round(t.makespan_ms, 9), sum(t.schedule.max_in_flight())))
