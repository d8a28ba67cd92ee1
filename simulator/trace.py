"""Chrome trace-event export of a simulated iteration (opens in Perfetto and chrome://tracing).

Layout: one process per device with a ``compute`` thread (forward, backward,
update, recompute), a ``collectives`` thread (AllReduce, all-gather, PS push
and pull) and a ``memory`` counter; one ``links`` process with a thread per
directed link showing every transfer and collective that held it. Events are
complete events (``ph: X``) with microsecond ``ts``/``dur``, sorted by time on
every track; tasks of zero duration are left out.
"""

from __future__ import annotations

from .tasks import TaskKind

# Chrome's reserved colour names, one per task kind
COLOURS = {
    TaskKind.FORWARD: "thread_state_running", TaskKind.BACKWARD: "rail_response",
    TaskKind.UPDATE: "rail_idle", TaskKind.RECOMPUTE: "olive", TaskKind.TRANSFER: "rail_load",
    TaskKind.ALLREDUCE: "terrible", TaskKind.ALLGATHER: "bad", TaskKind.PS_PUSH: "yellow",
    TaskKind.PS_PULL: "yellow",
}
COMPUTE_TID, COLLECTIVE_TID = 1, 2
MAX_COUNTER_POINTS = 20000


def chrome_trace(result) -> dict:
    """The trace of ``result`` (a SimResult) as a JSON-ready dict.

    Complexity: O(tasks x links per task + memory events), plus sorting.
    """
    tg, s = result.tasks, result.schedule
    n_dev = len(tg.device_names)
    links_pid = n_dev + 1
    meta: list[dict] = []
    for d, name in enumerate(tg.device_names):
        pid = d + 1
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": name}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COMPUTE_TID,
                     "args": {"name": "compute"}})
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COLLECTIVE_TID,
                     "args": {"name": "collectives"}})
    if tg.n_links:
        meta.append({"ph": "M", "name": "process_name", "pid": links_pid, "tid": 0,
                     "args": {"name": "links"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": links_pid, "tid": 0,
                     "args": {"sort_index": links_pid}})
    for r in range(tg.n_links):
        a, b = tg.resource_names[r]
        meta.append({"ph": "M", "name": "thread_name", "pid": links_pid, "tid": r + 1,
                     "args": {"name": f"{a} -> {b}"}})
    events: list[dict] = []
    n_links = tg.n_links
    for t, k in enumerate(tg.kind):
        dur = tg.duration_ms[t]
        if dur <= 0:
            continue
        kind = TaskKind(k)
        base = {"ph": "X", "name": tg.describe(t), "cat": kind.label,
                "ts": round(s.start_ms[t] * 1e3, 3), "dur": round(dur * 1e3, 3),
                "cname": COLOURS[kind]}
        if tg.nbytes[t]:
            base["args"] = {"bytes": int(tg.nbytes[t])}
        d = tg.device[t]
        if d >= 0:
            events.append({**base, "pid": d + 1, "tid": COMPUTE_TID})
            continue
        for r in tg.resources[t]:
            if r < n_links:
                events.append({**base, "pid": links_pid, "tid": r + 1})
            else:
                events.append({**base, "pid": r - n_links + 1, "tid": COLLECTIVE_TID})
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    counters: list[dict] = []
    for d, (times, levels) in result.memory_timeline.items():
        step = max(1, len(times) // MAX_COUNTER_POINTS)
        last = None
        for i in range(0, len(times), step):
            ts = round(float(times[i]) * 1e3, 3)
            if ts == last:
                counters[-1]["args"]["bytes"] = int(levels[i])
                continue
            last = ts
            counters.append({"ph": "C", "name": "memory", "pid": d + 1, "ts": ts,
                             "args": {"bytes": int(levels[i])}})
    return {"traceEvents": meta + events + counters, "displayTimeUnit": "ms",
            "otherData": {"iteration_ms": result.iteration_ms, "planner": result.plan.planner,
                          "tasks": len(tg)}}


SIMULATED_PID, MEASURED_PID = 1, 2
CATEGORY_COLOURS = {"compute": "thread_state_running", "communication": "rail_load",
                    "update": "rail_idle"}


def compared_trace(result, run) -> dict:
    """One trace of the simulated iteration of ``result`` and the measured step of ``run``
    (a run-report with a timeline), as two processes: ``simulated`` (a thread per track of
    ``chrome_trace``: each device's compute and collectives, each link) and ``measured`` (a
    thread per rank: its actions, the waits nested in them, the gradient exchange and the
    update). Both start at 0, the measured one at the earliest rank's start of the step.

    Raises ``BadInput`` when the run recorded no timeline. Complexity: that of
    ``chrome_trace`` plus O(spans of the run's timeline).
    """
    from dl_nfv.artifacts import BadInput

    if run.timeline_step is None:
        raise BadInput(f"the run of {run.plan_path or 'this plan'} recorded no timeline to "
                       f"trace beside the simulation; run it again with dl-nfv train")
    sim = chrome_trace(result)
    processes = {e["pid"]: e["args"]["name"] for e in sim["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": SIMULATED_PID, "tid": 0,
         "args": {"name": f"simulated ({result.iteration_ms:.3f} ms)"}},
        {"ph": "M", "name": "process_sort_index", "pid": SIMULATED_PID, "tid": 0,
         "args": {"sort_index": SIMULATED_PID}}]

    def tid(pid: int, thread: int) -> int:
        return pid * 1000 + thread

    for e in sim["traceEvents"]:
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                t = tid(e["pid"], e["tid"])
                events.append({**e, "pid": SIMULATED_PID, "tid": t,
                               "args": {"name": f"{processes[e['pid']]} {e['args']['name']}"}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": SIMULATED_PID,
                               "tid": t, "args": {"sort_index": t}})
        elif e["ph"] == "C":
            events.append({**e, "pid": SIMULATED_PID, "name": f"memory {processes[e['pid']]}"})
        else:
            events.append({**e, "pid": SIMULATED_PID, "tid": tid(e["pid"], e["tid"])})
    device_of = {rank: device for device, rank in run.ranks.items()}
    events.append({"ph": "M", "name": "process_name", "pid": MEASURED_PID, "tid": 0,
                   "args": {"name": f"measured (step {run.timeline_step}, "
                                    f"{_step_ms(run):.3f} ms)"}})
    events.append({"ph": "M", "name": "process_sort_index", "pid": MEASURED_PID, "tid": 0,
                   "args": {"sort_index": MEASURED_PID}})
    for rank in sorted(device_of):
        events.append({"ph": "M", "name": "thread_name", "pid": MEASURED_PID, "tid": rank + 1,
                       "args": {"name": f"{device_of[rank]} (rank {rank})"}})
    for span in run.timeline:
        events.append({"ph": "X", "name": span.name, "cat": span.category,
                       "pid": MEASURED_PID, "tid": span.rank + 1,
                       "ts": round(span.start_ms * 1e3, 3),
                       "dur": round((span.end_ms - span.start_ms) * 1e3, 3),
                       "cname": CATEGORY_COLOURS[span.category]})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"iteration_ms": result.iteration_ms, "planner": result.plan.planner,
                          "measured_step": run.timeline_step,
                          "measured_step_ms": _step_ms(run)}}


def _step_ms(run) -> float:
    """The measured step's time: its slowest rank's."""
    if run.timeline_step is None:
        return 0.0
    return max(r.iteration_ms[run.timeline_step] for r in run.per_rank)
