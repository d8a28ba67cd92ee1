"""Co-run contention: CPU devices of one host that compute at the same time slow each other.

Cores of one CPU share its last-level cache and memory bandwidth, so a training process
computes slower while another one on the same host computes too. The profile measures
how much for the model itself (``ProfileInfo.co_run_slowdown`` = s, a step beside one
other process stepping, over the step alone: ``profilers/corun.py``). The simulator
charges it in one refinement pass: it schedules the iteration at the measured (alone)
times, then stretches every compute task on such a device by ``1 + (s - 1) x k``, where
``k`` is the time-averaged number of other devices of its host that compute while it
runs (0 to 1 with two devices), and schedules again.

Limits: one pass, not a fixed point (the stretched schedule can overlap a little more or
less than the first); linear in the number of others (only two processes are measured);
communication driven by the host's cores (CPU collectives) neither slows nor is slowed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .costs import CostModel
from .engine import Schedule
from .tasks import TaskGraph


def contended_hosts(tg: TaskGraph, cm: CostModel) -> list[list[int]]:
    """Device indices per host where two or more of the plan's devices slow each other
    (``CostModel.co_run_slowdown`` > 1)."""
    by_host: dict[str, list[int]] = defaultdict(list)
    for d, name in enumerate(tg.device_names):
        if cm.co_run_slowdown(name) > 1.0:
            by_host[cm.cluster.device(name).host].append(d)
    return [ds for ds in by_host.values() if len(ds) > 1]


def stretch(tg: TaskGraph, schedule: Schedule, cm: CostModel) -> bool:
    """Stretch ``tg``'s compute tasks by the contention ``schedule`` shows (module doc), in
    place; True when any changed. O(tasks log tasks)."""
    hosts = contended_hosts(tg, cm)
    if not hosts:
        return False
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
        # busy(x): how many of the host's devices compute at time x; area(x) its integral
        points = np.unique(np.concatenate([s, e]))
        delta = np.zeros(len(points))
        np.add.at(delta, np.searchsorted(points, s), 1.0)
        np.add.at(delta, np.searchsorted(points, e), -1.0)
        busy = np.cumsum(delta)[:-1]
        area = np.concatenate([[0.0], np.cumsum(busy * np.diff(points))])
        span = e - s
        # the others' busy time over the task's span: the whole area less the task's own
        others = (area[np.searchsorted(points, e)] - area[np.searchsorted(points, s)] - span) / span
        slowdown = {d: cm.co_run_slowdown(tg.device_names[d]) for d in devices}
        for t, k in zip(tasks, others.tolist()):
            if k > 1e-9:
                dur[t] *= 1.0 + (slowdown[device[t]] - 1.0) * k
                changed = True
    return changed
