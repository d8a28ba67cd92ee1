"""The discrete-event engine: runs a ``TaskGraph`` and returns every task's start and end.

Model (docs/simulator.md states it with its limits):

* A **compute** task runs on its device's single compute stream; among the
  ready tasks of a device the one with the lowest ``priority`` (then the lowest
  id) starts as soon as the stream is free. Chained orders (pipeline
  schedules, ``plan.order``) are dependencies, so only one of them is ever
  ready.
* A **communication** task holds every resource it names (the directed links
  of its route, and each participant's collective stream for collectives) for
  its whole duration. Resources are granted first come, first served at the
  moment the task becomes ready (FIFO per resource, whole-route reservation):
  it starts when the last of its resources frees up. So a link carries one
  transfer at a time, at most at its bandwidth.
* On a **host-driven** device (a CPU: the collective library copies and sums
  on the worker's own cores) communication and compute share one stream: a
  communication task that holds the device's stream also waits for the
  compute task running there, and the device starts no compute task until the
  stream is free again.
* Time advances from event to event (task ends); tasks that become ready at
  the same instant are all queued before any idle device picks one, so the
  priority decides between them.

The engine is a tight loop over plain lists (no per-task objects); see
docs/simulator.md for where its time goes.
"""

from __future__ import annotations

from heapq import heappop, heappush

from dl_nfv.artifacts import BadInput

from .tasks import TaskGraph


class Schedule:
    """Start, end and ready times of every task, and what each one waited for last."""

    __slots__ = ("start_ms", "end_ms", "ready_ms", "cause")

    def __init__(self, start_ms: list[float], end_ms: list[float], ready_ms: list[float],
                 cause: list[int]):
        self.start_ms = start_ms
        self.end_ms = end_ms
        self.ready_ms = ready_ms
        # the task whose end let this one start: its last dependency, or the task that
        # held its device or resource until then; -1 when it started at time 0
        self.cause = cause


def run(tg: TaskGraph) -> Schedule:
    """Simulate ``tg``; see the module docstring for the model.

    Returns
    -------
    Schedule

    Raises
    ------
    BadInput
        When tasks are left that can never start (a cyclic ``order`` or a
        pipeline schedule that deadlocks); the message names the cycle.

    Complexity: O((tasks + dependencies) log tasks + sum of resources per comm task).
    """
    n = len(tg.kind)
    device = tg.device
    dur = tg.duration_ms
    succ = tg.succ
    prio = tg.priority
    res = tg.resources
    remaining = list(tg.ndeps)
    n_dev = len(tg.device_names)
    n_res = len(tg.resource_names)
    start = [0.0] * n
    end = [0.0] * n
    ready = [0.0] * n
    cause = [-1] * n
    busy = [False] * n_dev
    last_on = [-1] * n_dev
    queues: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]
    res_free = [0.0] * n_res
    res_last = [-1] * n_res
    # host-driven devices: stream resource -> device, and the compute task running on each
    n_links = tg.n_links
    res_dev = [-1] * n_res
    for d, hosted in enumerate(tg.host_driven):
        if hosted:
            res_dev[n_links + d] = d
    any_host = any(tg.host_driven)
    running = [-1] * n_dev
    events: list[tuple[float, int]] = []
    done = 0

    newly = [t for t in range(n) if remaining[t] == 0]
    touched: list[int] = []
    now = 0.0
    while True:
        # queue compute tasks, reserve resources for communication tasks
        for t in newly:
            d = device[t]
            if d >= 0:
                heappush(queues[d], (prio[t], t))
                touched.append(d)
            else:
                s = now
                blocker = -1
                rs = res[t]
                for r in rs:
                    f = res_free[r]
                    if f > s:
                        s = f
                        blocker = res_last[r]
                    if any_host:
                        d = res_dev[r]
                        if d >= 0 and busy[d] and end[running[d]] > s:
                            s = end[running[d]]
                            blocker = running[d]
                e = s + dur[t]
                for r in rs:
                    res_free[r] = e
                    res_last[r] = t
                start[t] = s
                end[t] = e
                if blocker >= 0:
                    cause[t] = blocker
                heappush(events, (e, t))
        # idle devices with queued work start their best task now
        for d in touched:
            if not busy[d]:
                q = queues[d]
                if q and not (any_host and res_dev[n_links + d] == d
                              and res_free[n_links + d] > now):
                    t = heappop(q)[1]
                    busy[d] = True
                    running[d] = t
                    start[t] = now
                    e = now + dur[t]
                    end[t] = e
                    if ready[t] < now:
                        cause[t] = last_on[d]
                    heappush(events, (e, t))
        if not events:
            break
        now, t = heappop(events)
        batch = [t]
        while events and events[0][0] == now:
            batch.append(heappop(events)[1])
        newly = []
        touched = []
        for t in batch:
            done += 1
            d = device[t]
            if d >= 0:
                busy[d] = False
                last_on[d] = t
                touched.append(d)
            elif any_host:
                for r in res[t]:
                    d = res_dev[r]
                    if d >= 0:
                        last_on[d] = t
                        touched.append(d)
            for s in succ[t]:
                remaining[s] -= 1
                if remaining[s] == 0:
                    ready[s] = now
                    cause[s] = t
                    newly.append(s)
    if done < n:
        raise BadInput(_deadlock_message(tg, remaining))
    return Schedule(start, end, ready, cause)


def _deadlock_message(tg: TaskGraph, remaining: list[int]) -> str:
    """Name a cycle among the tasks that never started."""
    preds = tg.predecessors()
    t = next(i for i, r in enumerate(remaining) if r > 0)
    seen: dict[int, int] = {}
    path: list[int] = []
    while t not in seen:
        seen[t] = len(path)
        path.append(t)
        t = next(p for p in preds[t] if remaining[p] > 0)
    cycle = path[seen[t]:]
    cycle.reverse()
    steps = " -> ".join(f"{tg.describe(c)} on {tg.where(c)}" for c in cycle[:6])
    more = f" -> ... ({len(cycle)} tasks)" if len(cycle) > 6 else ""
    return (f"the plan's order or pipeline schedule is cyclic: {steps}{more} -> "
            f"{tg.describe(cycle[0])} (each waits for the one before it)")
