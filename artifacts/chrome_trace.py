"""What a Chrome/Perfetto trace file holds, summarised per track.

``dl-nfv simulate --trace`` and ``dl-nfv train --trace`` write Chrome trace-event
JSON (``{"traceEvents": [...]}``), a format other tools read, so it carries no
``kind``. ``summarise_trace`` reads one back: for every track (a process and
thread, named by their metadata events) the number of complete (``ph: X``) and
other timed events, the busy time (sum of durations) and the first and last
instants; and the time span of the whole trace. Timestamps are microseconds in
the file and milliseconds here.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArtifact
from .records import record


@record
class TrackSummary:
    process: str
    thread: str
    events: int  # timed events (complete, begin/end pairs count once per begin, instants, counters)
    busy_ms: float  # sum of the complete events' durations
    first_ms: float
    last_ms: float  # end of the last event


@record
class TraceSummary:
    events: int
    tracks: tuple[TrackSummary, ...]
    start_ms: float
    end_ms: float

    @property
    def span_ms(self) -> float:
        return self.end_ms - self.start_ms


def is_chrome_trace(doc: Any) -> bool:
    """Whether a parsed document is a Chrome trace-event file rather than an artifact."""
    return isinstance(doc, dict) and "kind" not in doc and isinstance(doc.get("traceEvents"), list)


def _number(event: dict, key: str, where: str) -> float:
    value = event.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArtifact(f"expected a number, got {value!r}", field=f"{where}.{key}")
    return float(value)


def _order(ident: Any) -> tuple:
    """Numeric ids in numeric order, then names."""
    if isinstance(ident, (int, float)) and not isinstance(ident, bool):
        return (0, ident, "")
    return (1, 0, str(ident))


def summarise_trace(doc: dict[str, Any]) -> TraceSummary:
    """Events per track, busy time and time span of a Chrome trace (``traceEvents`` list).

    Raises ``InvalidArtifact`` naming the event when one is not a mapping or has a
    non-numeric ``ts``/``dur``. Complexity: O(events).
    """
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    tracks: dict[tuple[Any, Any], list[float]] = {}  # events, busy, first, last
    total = 0
    for i, event in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(event, dict):
            raise InvalidArtifact(f"expected a mapping, got {event!r}"[:80], field=where)
        phase = event.get("ph")
        key = (event.get("pid"), event.get("tid"))
        if phase == "M":
            name = (event.get("args") or {}).get("name")
            if event.get("name") == "process_name" and name is not None:
                processes[key[0]] = str(name)
            elif event.get("name") == "thread_name" and name is not None:
                threads[key] = str(name)
            continue
        if phase in ("E", "e", "f", "s", "t", None):  # ends and flow arrows are not events
            continue
        if phase == "C":  # a counter is a track of its own, named by the counter
            key = (key[0], f"{event.get('name', 'counter')} (counter)")
            threads.setdefault(key, key[1])
        ts_ms = _number(event, "ts", where) / 1e3
        dur_ms = _number(event, "dur", where) / 1e3 if phase == "X" else 0.0
        stats = tracks.setdefault(key, [0, 0.0, ts_ms, ts_ms + dur_ms])
        stats[0] += 1
        stats[1] += dur_ms
        stats[2] = min(stats[2], ts_ms)
        stats[3] = max(stats[3], ts_ms + dur_ms)
        total += 1
    rows = tuple(
        TrackSummary(process=processes.get(pid, str(pid)), thread=threads.get((pid, tid), str(tid)),
                     events=int(s[0]), busy_ms=s[1], first_ms=s[2], last_ms=s[3])
        for (pid, tid), s in sorted(tracks.items(), key=lambda kv: (_order(kv[0][0]), _order(kv[0][1]))))
    return TraceSummary(events=total, tracks=rows,
                        start_ms=min((r.first_ms for r in rows), default=0.0),
                        end_ms=max((r.last_ms for r in rows), default=0.0))
