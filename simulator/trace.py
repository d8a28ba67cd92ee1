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
