"""The ``run-report`` artifact: what ``dl-nfv train`` ran, and what it measured.

A run report names the plan it executed (its sha256 fingerprint, planner and
the graph/topology fingerprints the plan was made for), how it ran (world
size, backend, threads per worker, the device -> rank mapping) and what each
rank measured:

* ``iteration_ms``: wall time of every step on that rank, warm-up steps
  included (the first ``warmup`` entries are warm-up);
* ``compute_ms`` / ``wait_ms``: the median over measured steps of the time the
  rank spent computing (forward, backward, optimizer) and the time it spent
  blocked in communication (collectives, send/recv, waiting for a peer);
* ``peak_memory_bytes``: peak resident memory of the worker (CPU: the
  process's maximum RSS; CUDA: ``torch.cuda.max_memory_allocated``);
* ``cpu_ms``: the median over measured steps of the CPU time the worker
  process used in a step (all its threads, communication threads included).
  On a machine shared with other jobs, wall times grow but this does not, so
  it tells contention apart from a slow plan;
* ``breakdown_ms``: every step's time by category: compute (the plan's forward, backward
  and weight-gradient actions), communication (blocked on a peer, and the gradient
  exchange after the actions), update (the optimizer), idle (the rest: the runtime's own
  work between them); the four sum to the step's time;
* ``threads`` / ``cpus``: the intra-op threads the worker ran with (its device's cores,
  unless ``--threads`` said otherwise) and the CPUs it was pinned to (empty: not pinned).

``threads`` at the top is the most threads any worker ran with. ``timeline`` holds every
rank's spans (``TimelineSpan``) in one measured step, ``timeline_step``: the one whose
slowest rank took the median time, on one clock (a host's monotonic clock; ranks on other
hosts are only as aligned as their clocks). ``iteration_ms`` at the
top is the run's figure: the median, over the steps
after warm-up, of the slowest rank's step time. ``losses`` holds the global
loss of every step (mean over the global batch). ``op_fwd_ms``/``op_bwd_ms``
optionally hold per-op measured times by device type (``{"cpu": {"fc1": 0.3}}``)
for planners that refine their estimates with measurements.
"""

from __future__ import annotations

import statistics
from dataclasses import field
from enum import StrEnum

from .records import check, record, unique

SCHEMA_VERSION = 1
# where a rank's step goes (``dl_nfv.runtime.timeline``): what its spans measure, and the rest
CATEGORIES = ("compute", "communication", "update", "idle")


class ExecutionMode(StrEnum):
    DATA_PARALLEL = "data-parallel"
    PARAMETER_SERVER = "parameter-server"
    PIPELINE = "pipeline"
    PLACEMENT = "placement"
    SINGLE = "single"


@record
class RankRun:
    """What one rank (one plan device) measured."""

    rank: int
    device: str
    host: str = ""
    iteration_ms: tuple[float, ...]
    compute_ms: float
    wait_ms: float
    peak_memory_bytes: int = 0
    cpu_ms: float | None = None
    threads: int | None = None
    cpus: tuple[int, ...] = ()
    # category (compute, communication, update, idle) -> its time in every step
    breakdown_ms: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # bytes this rank sent to synchronise gradients in its last step, by method (allreduce,
    # sfb), as the ring algorithms send them; empty in reports of older runs
    sent_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.rank >= 0, f"rank must be >= 0, got {self.rank}")
        check(all(n >= 0 for n in self.sent_bytes.values()),
              f"rank {self.rank}: sent_bytes must be >= 0, got {self.sent_bytes}")
        for category, times in self.breakdown_ms.items():
            check(category in CATEGORIES, f"rank {self.rank}: breakdown_ms category must be one "
                                          f"of {', '.join(CATEGORIES)}, got {category!r}")
            check(len(times) == len(self.iteration_ms),
                  f"rank {self.rank}: {len(times)} breakdown_ms.{category} for "
                  f"{len(self.iteration_ms)} steps")
            check(all(t >= 0 for t in times),
                  f"rank {self.rank}: breakdown_ms.{category} must be >= 0, got {min(times)}")
        check(self.threads is None or self.threads >= 1,
              f"rank {self.rank}: threads must be >= 1, got {self.threads}")
        check(self.cpu_ms is None or self.cpu_ms >= 0,
              f"rank {self.rank}: cpu_ms must be >= 0, got {self.cpu_ms}")
        check(bool(self.iteration_ms), f"rank {self.rank}: iteration_ms is empty")
        check(all(t >= 0 for t in self.iteration_ms),
              f"rank {self.rank}: iteration_ms must be >= 0, got {min(self.iteration_ms)}")
        check(self.compute_ms >= 0, f"rank {self.rank}: compute_ms must be >= 0, got {self.compute_ms}")
        check(self.wait_ms >= 0, f"rank {self.rank}: wait_ms must be >= 0, got {self.wait_ms}")
        check(self.peak_memory_bytes >= 0,
              f"rank {self.rank}: peak_memory_bytes must be >= 0, got {self.peak_memory_bytes}")


@record
class TimelineSpan:
    """One span of a rank's step: an action (compute), a wait on a peer or the gradient
    exchange (communication), or the optimizer (update), from the step's start (ms)."""

    rank: int
    category: str
    name: str
    start_ms: float
    end_ms: float

    def __post_init__(self) -> None:
        check(self.category in CATEGORIES[:3],
              f"span {self.name!r}: category must be one of {', '.join(CATEGORIES[:3])}, "
              f"got {self.category!r}")
        check(self.end_ms >= self.start_ms,
              f"span {self.name!r} of rank {self.rank} ends ({self.end_ms}) before it starts "
              f"({self.start_ms})")


@record
class RunReport:
    kind: str = "run-report"
    schema_version: int = SCHEMA_VERSION
    plan_sha256: str
    planner: str
    plan_path: str = ""
    graph_sha256: str = ""
    topology_sha256: str = ""
    model: str = ""
    mode: ExecutionMode
    batch_size: int
    world_size: int
    ranks: dict[str, int]
    backend: str
    threads: int = 1
    steps: int
    warmup: int = 0
    iteration_ms: float
    losses: tuple[float, ...] = ()
    per_rank: tuple[RankRun, ...]
    predicted_iteration_ms: float | None = None
    op_fwd_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    op_bwd_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    trace_path: str = ""
    notes: tuple[str, ...] = ()
    # the spans of every rank in one measured step (``timeline_step``: the one whose slowest
    # rank took the median time), from the earliest rank's start of that step
    timeline_step: int | None = None
    timeline: tuple[TimelineSpan, ...] = ()

    def __post_init__(self) -> None:
        import re

        check(re.fullmatch(r"[0-9a-f]{64}", self.plan_sha256) is not None,
              f"plan_sha256 must be 64 hex digits, got {self.plan_sha256!r}")
        check(self.world_size >= 1, f"world_size must be >= 1, got {self.world_size}")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        check(0 <= self.warmup < self.steps,
              f"warmup must be in [0, steps={self.steps}), got {self.warmup}")
        check(self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        check(self.iteration_ms >= 0, f"iteration_ms must be >= 0, got {self.iteration_ms}")
        check(len(self.ranks) == self.world_size,
              f"ranks maps {len(self.ranks)} devices, but world_size is {self.world_size}")
        check(sorted(self.ranks.values()) == list(range(self.world_size)),
              f"ranks must be 0..{self.world_size - 1} once each, got {sorted(self.ranks.values())}")
        check(len(self.per_rank) == self.world_size,
              f"per_rank has {len(self.per_rank)} entries, but world_size is {self.world_size}")
        unique((str(r.rank) for r in self.per_rank), "rank in per_rank:")
        for r in self.per_rank:
            check(self.ranks.get(r.device) == r.rank,
                  f"per_rank: rank {r.rank} runs {r.device!r}, but ranks maps it to "
                  f"{self.ranks.get(r.device)}")
            check(len(r.iteration_ms) == self.steps,
                  f"rank {r.rank}: {len(r.iteration_ms)} iteration_ms for {self.steps} steps")
        check(not self.losses or len(self.losses) == self.steps,
              f"{len(self.losses)} losses for {self.steps} steps")
        check(self.timeline_step is None or self.warmup <= self.timeline_step < self.steps,
              f"timeline_step must be a measured step in [{self.warmup}, {self.steps}), got "
              f"{self.timeline_step}")
        for span in self.timeline:
            check(0 <= span.rank < self.world_size,
                  f"timeline: rank {span.rank} is not in 0..{self.world_size - 1}")

    def rank_of(self, device: str) -> RankRun:
        return next(r for r in self.per_rank if r.device == device)

    @property
    def step_ms(self) -> tuple[float, ...]:
        """Every measured step's time: the slowest rank's wall time of that step."""
        return tuple(max(r.iteration_ms[i] for r in self.per_rank)
                     for i in range(self.warmup, self.steps))


def median_iteration_ms(per_rank: tuple[RankRun, ...] | list[RankRun], warmup: int) -> float:
    """Median over the steps after ``warmup`` of the slowest rank's step time."""
    steps = len(per_rank[0].iteration_ms)
    return statistics.median(max(r.iteration_ms[i] for r in per_rank) for i in range(warmup, steps))
