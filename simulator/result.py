"""``SimResult``: a simulated iteration, its memory, critical path and report.

``simulate`` computes only what a planner's search loop needs (iteration
time, busy time, memory peaks and overflows); the critical path, the link and
overlap statistics, the report and the trace are built when first asked for.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from dl_nfv.artifacts import OpGraph, Plan, Topology, fingerprint
from dl_nfv.artifacts.simreport import (
    CriticalStep,
    DeviceUsage,
    LinkUsage,
    Overflow,
    SimReport,
)

from .costs import CostModel
from .engine import Schedule
from .tasks import COMPUTE_KINDS, TaskGraph, TaskKind


class SimResult:
    """The outcome of ``simulate(plan, graph, topology)``.

    Attributes
    ----------
    iteration_ms : float
        End of the last task (the iteration starts at 0 with every device idle).
    busy_ms : dict[str, float]
        Compute time per device.
    peak_memory_bytes : dict[str, int]
        Static memory plus the peak of live activations, per device.
    overflows : list[tuple[str, float, int]]
        ``(device, time_ms, shortfall_bytes)`` for each device whose peak
        exceeds its memory, at the time of its peak.
    tasks : TaskGraph
        The lowered plan; ``schedule`` holds every task's start and end.
    """

    def __init__(self, plan: Plan, graph: OpGraph, topology: Topology, cost_model: CostModel,
                 tasks: TaskGraph, schedule: Schedule):
        self.plan = plan
        self.graph = graph
        self.topology = topology
        self.cost_model = cost_model
        self.tasks = tasks
        self.schedule = schedule
        end = schedule.end_ms
        self.iteration_ms: float = max(end) if end else 0.0
        names = tasks.device_names
        busy = np.bincount(np.asarray([d for d in tasks.device if d >= 0], dtype=np.int64),
                           weights=[w for d, w in zip(tasks.device, tasks.duration_ms) if d >= 0],
                           minlength=len(names)) if tasks.device else np.zeros(len(names))
        self.busy_ms: dict[str, float] = {d: float(b) for d, b in zip(names, busy)}
        self._memory()

    # ------------------------------------------------------------- memory
    def _memory(self) -> None:
        tg = self.tasks
        names = tg.device_names
        peaks, peak_time, self.memory_timeline = memory_levels(tg, self.schedule)
        self.peak_memory_bytes: dict[str, int] = {n: int(round(p)) for n, p in zip(names, peaks)}
        self.overflows: list[tuple[str, float, int]] = []
        for d, name in enumerate(names):
            shortfall = int(round(peaks[d])) - tg.capacity_bytes[d]
            if shortfall > 0:
                self.overflows.append((name, float(peak_time[d]), shortfall))

    @property
    def feasible(self) -> bool:
        """True when no device's memory overflows."""
        return not self.overflows

    # ------------------------------------------------------ critical path
    @cached_property
    def critical_path_tasks(self) -> list[int]:
        """Task ids from the first to the last task of the chain that ends the iteration.

        Each task is preceded by what it waited for last: its latest
        dependency, or the task that held its device or link until it could start.
        """
        end = self.schedule.end_ms
        if not end:
            return []
        t = max(range(len(end)), key=end.__getitem__)
        cause = self.schedule.cause
        path = []
        while t >= 0:
            path.append(t)
            t = cause[t]
        path.reverse()
        return path

    @cached_property
    def critical_path(self) -> list[CriticalStep]:
        """The critical path, consecutive tasks of one kind in one place merged into one step."""
        tg, s = self.tasks, self.schedule
        steps: list[CriticalStep] = []
        keys: list[tuple] = []
        first: list[str] = []
        for t in self.critical_path_tasks:
            k = tg.kind[t]
            mb = tg.info[t][2] if k in (TaskKind.FORWARD, TaskKind.BACKWARD) else None
            key = (k, tg.where(t), mb)
            if keys and keys[-1] == key:
                last = steps[-1]
                steps[-1] = CriticalStep(kind=last.kind, name=f"{first[-1]} .. {tg.describe(t)}",
                                         where=last.where, start_ms=last.start_ms,
                                         end_ms=s.end_ms[t], tasks=last.tasks + 1)
                continue
            keys.append(key)
            first.append(tg.describe(t))
            steps.append(CriticalStep(kind=TaskKind(k).label, name=first[-1], where=key[1],
                                      start_ms=s.start_ms[t], end_ms=s.end_ms[t]))
        return steps

    @cached_property
    def longest_chain_ms(self) -> float:
        """Longest dependency chain by task durations (no resource waits): a lower bound."""
        tg = self.tasks
        dur = tg.duration_ms
        remaining = list(tg.ndeps)
        finish = [0.0] * len(dur)
        stack = [t for t, r in enumerate(remaining) if r == 0]
        earliest = [0.0] * len(dur)
        while stack:
            t = stack.pop()
            f = finish[t] = earliest[t] + dur[t]
            for s in tg.succ[t]:
                if f > earliest[s]:
                    earliest[s] = f
                remaining[s] -= 1
                if remaining[s] == 0:
                    stack.append(s)
        return max(finish, default=0.0)

    # ------------------------------------------------------ communication
    def _comm_by_device(self) -> dict[int, list[tuple[float, float]]]:
        tg, s = self.tasks, self.schedule
        n_links = tg.n_links
        out: dict[int, list[tuple[float, float]]] = {}
        for t, k in enumerate(tg.kind):
            if k in COMPUTE_KINDS or tg.duration_ms[t] <= 0:
                continue
            span = (s.start_ms[t], s.end_ms[t])
            if k == TaskKind.TRANSFER:
                devs = (tg.info[t][4], tg.info[t][5])
            else:
                devs = tuple(r - n_links for r in tg.resources[t] if r >= n_links)
            for d in devs:
                out.setdefault(d, []).append(span)
        return out

    @cached_property
    def _overlap(self) -> dict[int, tuple[float, float]]:
        """Per device: (communication time, part of it overlapped by its own computation)."""
        tg, s = self.tasks, self.schedule
        compute: dict[int, list[tuple[float, float]]] = {}
        for t, d in enumerate(tg.device):
            if d >= 0 and tg.duration_ms[t] > 0:
                compute.setdefault(d, []).append((s.start_ms[t], s.end_ms[t]))
        out = {}
        for d, spans in self._comm_by_device().items():
            comm = _union(spans)
            total = sum(b - a for a, b in comm)
            out[d] = (total, _intersection(comm, _union(compute.get(d, []))))
        return out

    @property
    def comm_hidden_fraction(self) -> float:
        """Share of device communication time overlapped by the same device's computation."""
        total = sum(c for c, _ in self._overlap.values())
        hidden = sum(h for _, h in self._overlap.values())
        return hidden / total if total > 0 else 0.0

    def breakdown_ms(self) -> dict[str, dict[str, float]]:
        """Per device, where the iteration goes, in the categories of the runtime's timeline.

        ``compute``: its forward, backward and recompute tasks; ``update``: its optimizer
        tasks (a PS server's too); ``communication``: the time its transfers and collectives
        run while it computes nothing (all of it on a host-driven CPU); ``idle``: the rest of
        the iteration. The four sum to the iteration time. O(tasks).
        """
        tg = self.tasks
        n = len(tg.device_names)
        compute, update = [0.0] * n, [0.0] * n
        for t, d in enumerate(tg.device):
            if d >= 0:
                if tg.kind[t] == TaskKind.UPDATE:
                    update[d] += tg.duration_ms[t]
                else:
                    compute[d] += tg.duration_ms[t]
        out = {}
        for d, name in enumerate(tg.device_names):
            comm, hidden = self._overlap.get(d, (0.0, 0.0))
            exposed = max(comm - hidden, 0.0)
            idle = max(self.iteration_ms - compute[d] - update[d] - exposed, 0.0)
            out[name] = {"compute": compute[d], "communication": exposed, "update": update[d],
                         "idle": idle}
        return out

    # ------------------------------------------------------------ outputs
    def to_report(self) -> SimReport:
        """The ``sim-report`` artifact of this result."""
        from .report import build_report

        return build_report(self)

    def trace(self) -> dict:
        """Chrome trace-event JSON (a dict) with one track per device stream and per link."""
        from .trace import chrome_trace

        return chrome_trace(self)

    def plan_fingerprint(self) -> str:
        return fingerprint(self.plan)


def memory_levels(tg: TaskGraph, schedule: Schedule
                  ) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Per device of ``tg`` under ``schedule``: static memory plus the peak of live
    activations, the time of that peak, and (devices with buffers) the memory over time
    as ``(times, bytes)``. O(buffers log buffers)."""
    n_dev = len(tg.device_names)
    static = np.asarray(tg.static_bytes, dtype=np.float64)
    peaks = static.copy()
    peak_time = np.zeros(n_dev)
    timeline: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if tg.buf_alloc:
        start = np.asarray(schedule.start_ms)
        end = np.asarray(schedule.end_ms)
        lengths = np.fromiter((len(r) for r in tg.buf_releasers), dtype=np.int64,
                              count=len(tg.buf_releasers))
        flat = np.fromiter((t for r in tg.buf_releasers for t in r), dtype=np.int64,
                           count=int(lengths.sum()))
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        free_t = np.maximum.reduceat(end[flat], offsets)
        alloc_t = start[np.asarray(tg.buf_alloc)]
        size = np.asarray(tg.buf_bytes)
        dev = np.asarray(tg.buf_device)
        times = np.concatenate([alloc_t, free_t])
        deltas = np.concatenate([size, -size])
        devs = np.concatenate([dev, dev])
        # per device, in time order; at equal times frees come before allocations
        order = np.lexsort((deltas, times, devs))
        times, deltas, devs = times[order], deltas[order], devs[order]
        level = np.cumsum(deltas)
        bounds = np.searchsorted(devs, np.arange(n_dev + 1))
        for d in range(n_dev):
            lo, hi = bounds[d], bounds[d + 1]
            if lo == hi:
                continue
            base = level[lo - 1] if lo > 0 else 0.0
            live = level[lo:hi] - base
            k = int(np.argmax(live))
            if live[k] > 0:
                peaks[d] = static[d] + live[k]
                peak_time[d] = times[lo + k]
            timeline[d] = (times[lo:hi], live + static[d])
    return peaks, peak_time, timeline


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _intersection(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


__all__ = ["CriticalStep", "DeviceUsage", "LinkUsage", "Overflow", "SimResult"]
