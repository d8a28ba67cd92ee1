"""Where a rank's step goes: compute, communication, update and idle, span by span.

Every step of a worker is timed as a set of nested spans on one clock
(``time.perf_counter``, the system's monotonic clock, shared by the processes of
a host):

* **compute**: a unit's forward, backward or weight-gradient action (named as the
  simulator names its tasks: ``forward stage1 mb3``);
* **communication**: every blocking wait on a peer (``recv``, a collective's or a
  send's ``wait``, timed by ``Comm``), the gradient exchange after the actions
  (``reduce gradients``: AllReduce waits, PS pushes and the server's sums) and a PS's
  pull of the parameters (``pull parameters``: with gloo a server sends its shard in
  its own thread, so the send's copy is there, not in the wait), as the simulator's
  ``ps-pull`` task is communication;
* **update**: zeroing the gradients (at the step's start) and the optimizer step: the
  optimizer's upkeep, as the simulator's update task holds it.

A span's own time is its length minus the spans nested in it (a ``recv`` inside a
forward is communication, not compute), so the three categories never count a
moment twice; **idle** is the rest of the step: the runtime's own work between
actions (slicing the batch, the loss). The categories of a step
therefore sum to the step's time. Cost: two clock reads and a list append per span.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from dl_nfv.artifacts.runreport import CATEGORIES

MEASURED = CATEGORIES[:3]  # idle is what the spans leave


class StepTimeline:
    """The spans of the current step of one rank, and their totals per category."""

    def __init__(self) -> None:
        self.start_s = 0.0
        self.spans: list[tuple[str, str, float, float]] = []  # category, name, start, end (ms)
        self.totals: dict[str, float] = dict.fromkeys(MEASURED, 0.0)
        self._nested: list[float] = []  # per open span: seconds of the spans nested in it

    def begin(self, start_s: float) -> None:
        """Start a step at ``start_s`` (``time.perf_counter()``); forget the last one."""
        self.start_s = start_s
        self.spans = []
        self.totals = dict.fromkeys(MEASURED, 0.0)
        self._nested = []

    @contextmanager
    def span(self, category: str, name: str) -> Iterator[None]:
        """Time the block as a span of ``category`` (spans opened inside it nest in it)."""
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            end = time.perf_counter()
            nested = self._nested.pop()
            self._close(category, name, start, end, nested)

    def add(self, category: str, name: str, start: float, end: float) -> None:
        """A span timed by the caller (``perf_counter`` seconds), inside the open span."""
        self._close(category, name, start, end, 0.0)

    def _close(self, category: str, name: str, start: float, end: float, nested: float) -> None:
        length = end - start
        self.totals[category] += (length - nested) * 1e3
        if self._nested:
            self._nested[-1] += length
        self.spans.append((category, name, (start - self.start_s) * 1e3,
                           (end - self.start_s) * 1e3))

    def finish(self, step_ms: float) -> dict[str, float]:
        """The step's time per category, idle being what the spans leave of ``step_ms``."""
        out = {c: round(v, 4) for c, v in self.totals.items()}
        out["idle"] = round(max(step_ms - sum(self.totals.values()), 0.0), 4)
        return out
