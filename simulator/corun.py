"""Co-run contention: CPU devices of one host that compute at the same time slow each other.

Cores of one CPU share its last-level cache and memory bandwidth, so a training process
computes slower while another one on the same host computes too. The profile measures
how much for the model itself (``ProfileInfo.co_run_slowdown`` = s, a step beside one
other process stepping the same model, over the step alone: ``profilers/corun.py``).

What slows a process is the memory its neighbours touch beside its own: the two points
the probe gives are one copy of the model's data in use (the op times, measured alone)
and two copies (s). A device's share ``w`` is its footprint (static memory plus its peak
of live activations under the schedule) over one replica's (the whole graph's
parameters, gradients, optimizer state and activations at the full batch, what a
single device holds); the neighbours' share ``n`` is the time-averaged sum of the shares
of the host's other devices that compute while a task runs. The host holds ``w + n``
copies' worth of data in use where the profile held one, so the task is stretched by
``1 + (s - 1) x min(n, max(0, w + n - 1))``: a neighbour's data counts only beyond the
one copy the alone times already paid for, and never more than the neighbour brings.
Two replicas of data parallelism (w = n = 1) get s; two pipeline stages or a placement,
each holding about half of one replica (w = n = 1/2), get nothing, as measured: with a
MoE profile whose slowdown read 1.35, four runs of its 2-stage GPipe plan took
12.1-13.0 ms against 12.6 predicted without the slowdown and 14.8 with it, four of its
data-parallel plan 7.8-8.8 ms against 8.2 with it and 7.0 without; and in the one of
three runs where the MoE slowed by a third beside a copy of itself, it slowed by 0.39,
0.67 and 1 of that beside a neighbour with a quarter, a half and all of its experts'
width (the other two runs, at 1.04 and 1.09, too small to tell). The update (the
optimizer's step and the gradients' zeroing: streams of the parameters, gradients and
optimizer state) slows more than the forward and backward beside a neighbour, and the
profile measures its own figure (``ProfileInfo.update_co_run_slowdown``, in lockstep with a
second process's training iterations, as data-parallel replicas update at once): update
tasks take it in place of the compute's, with the same shares. The simulator
charges it in one refinement pass: it schedules the iteration at the measured (alone)
times, stretches every compute task on such a device, and schedules again.

Limits: one pass, not a fixed point (the stretched schedule can overlap a little more or
less than the first); linear between the two measured points and beyond them (three
replicas on one host: twice the slowdown's excess); the footprint counts memory held,
not memory touched per second, so a model far larger than the cache, whose co-run
slowdown comes from memory bandwidth, is charged as if the cache's capacity were what
the neighbours share (its measured slowdown is small: 1.00-1.06 for ResNet-50 and GPT-2
on this project's machines; an update's, which is the memory bandwidth's for such a
model, the MLP's x1.70, is charged only where the devices' data passes one copy: to data
parallelism's replicas, not to two halves of the model updating at once); communication
driven by the host's cores (CPU collectives) neither slows nor is slowed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .costs import CostModel
from .engine import Schedule
from .result import memory_levels
from .tasks import TaskGraph, TaskKind


def contended_hosts(tg: TaskGraph, cm: CostModel) -> list[list[int]]:
    """Device indices per host where two or more of the plan's devices slow each other
    (``CostModel.co_run_slowdown`` or ``update_co_run_slowdown`` > 1)."""
    by_host: dict[str, list[int]] = defaultdict(list)
    for d, name in enumerate(tg.device_names):
        if cm.co_run_slowdown(name) > 1.0 or cm.update_co_run_slowdown(name) > 1.0:
            by_host[cm.cluster.device(name).host].append(d)
    return [ds for ds in by_host.values() if len(ds) > 1]


def stretch(tg: TaskGraph, schedule: Schedule, cm: CostModel, state_factor: float) -> bool:
    """Stretch ``tg``'s compute tasks by the contention ``schedule`` shows (module doc), in
    place; True when any changed. ``state_factor``: the plan's optimizer state per
    parameter byte, for one replica's footprint (none known, from a graph without bytes:
    every device counts as a whole replica). O(tasks log tasks)."""
    hosts = contended_hosts(tg, cm)
    if not hosts:
        return False
    replica_bytes = cm.replica_bytes(state_factor)
    if replica_bytes > 0:
        share = memory_levels(tg, schedule)[0] / replica_bytes
    else:
        share = np.ones(len(tg.device_names))
    device, dur = tg.device, tg.duration_ms
    start, end = schedule.start_ms, schedule.end_ms
    changed = False
    for devices in hosts:
        members = set(devices)
        tasks = [t for t, d in enumerate(device) if d in members and end[t] > start[t]]
        if not tasks:
            continue
        s = np.fromiter((start[t] for t in tasks), dtype=np.float64, count=len(tasks))
        e = np.fromiter((end[t] for t in tasks), dtype=np.float64, count=len(tasks))
        w = share[np.fromiter((device[t] for t in tasks), dtype=np.int64, count=len(tasks))]
        # load(x): the shares of the host's devices computing at time x; area(x) its integral
        points = np.unique(np.concatenate([s, e]))
        delta = np.zeros(len(points))
        np.add.at(delta, np.searchsorted(points, s), w)
        np.add.at(delta, np.searchsorted(points, e), -w)
        load = np.cumsum(delta)[:-1]
        area = np.concatenate([[0.0], np.cumsum(load * np.diff(points))])
        span = e - s
        # the others' shares over the task's span: the whole area less the task's own
        others = (area[np.searchsorted(points, e)] - area[np.searchsorted(points, s)]
                  - w * span) / span
        excess = np.minimum(others, np.maximum(0.0, w + others - 1.0))
        slowdown = {d: cm.co_run_slowdown(tg.device_names[d]) for d in devices}
        updating = {d: cm.update_co_run_slowdown(tg.device_names[d]) for d in devices}
        kind = tg.kind
        for t, x in zip(tasks, excess.tolist()):
            if x > 1e-9:
                s = (updating if kind[t] == TaskKind.UPDATE else slowdown)[device[t]]
                dur[t] *= 1.0 + (s - 1.0) * x
                changed = True
    return changed
