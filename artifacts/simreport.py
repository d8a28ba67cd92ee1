"""The ``sim-report`` artifact: what ``dl-nfv simulate`` predicts for a plan.

It names the plan it simulated (its sha256 and planner, and the graph and
topology fingerprints) and holds the predicted iteration time, per-device
busy time and memory, per-link traffic and busy time, any memory overflow
(device, time, shortfall), the critical path, and the share of communication
hidden behind computation. With ``simulate --compare`` it also holds the
measured run beside the prediction.
"""

from __future__ import annotations

from dataclasses import field

from .records import check, record

SCHEMA_VERSION = 1


@record
class DeviceUsage:
    """One device over one simulated iteration.

    ``comm_ms``: the time transfers and collectives hold it; ``host_driven``: its own cores
    do that work (a CPU: gloo copies and sums there), so it computes nothing meanwhile.
    """

    device: str
    type: str
    busy_ms: float
    busy_fraction: float
    compute_tasks: int
    comm_ms: float = 0.0
    hidden_comm_ms: float = 0.0
    static_bytes: int = 0
    peak_memory_bytes: int
    memory_bytes: int
    host_driven: bool = False

    def __post_init__(self) -> None:
        check(self.busy_ms >= 0, f"{self.device}: busy_ms must be >= 0, got {self.busy_ms}")
        check(0 <= self.busy_fraction <= 1 + 1e-9,
              f"{self.device}: busy_fraction must be in [0, 1], got {self.busy_fraction}")
        check(self.peak_memory_bytes >= 0,
              f"{self.device}: peak_memory_bytes must be >= 0, got {self.peak_memory_bytes}")

    @property
    def idle_fraction(self) -> float:
        return max(0.0, 1.0 - self.busy_fraction)


@record
class LinkUsage:
    """One direction of one link: what crossed it and how long it was held."""

    src: str
    dst: str
    bandwidth_gbps: float
    transfer_bytes: int = 0
    collective_bytes: int = 0
    busy_ms: float
    busy_fraction: float
    tasks: int

    def __post_init__(self) -> None:
        check(self.busy_ms >= 0, f"link {self.src}->{self.dst}: busy_ms must be >= 0")


@record
class Overflow:
    """A device whose memory demand exceeds its capacity: when it peaks and by how much."""

    device: str
    time_ms: float
    shortfall_bytes: int

    def __post_init__(self) -> None:
        check(self.shortfall_bytes > 0, f"{self.device}: shortfall_bytes must be > 0")


@record
class CriticalStep:
    """One stretch of the critical path: ``tasks`` consecutive tasks of one kind in one place."""

    kind: str
    name: str
    where: str
    start_ms: float
    end_ms: float
    tasks: int = 1

    def __post_init__(self) -> None:
        check(self.end_ms >= self.start_ms, f"critical step {self.name!r} ends before it starts")


@record
class Comparison:
    """A measured run (``run-report``) beside the prediction.

    Per device (the rank that ran it): its median step (``measured_ms_by_device``), the
    median time it computed and the time it was blocked in communication
    (``measured_compute_ms_by_device``, ``measured_wait_ms_by_device``), and where the run
    recorded it the CPU time its process used per step (``measured_cpu_ms_by_device``),
    beside the simulated compute time (``predicted_busy_ms_by_device``); the report's
    ``devices`` hold the rest of the prediction. Where the run recorded its timeline, each
    device's step by category (compute, communication, update, idle: see
    ``dl_nfv.runtime.timeline`` and ``SimResult.breakdown_ms``), measured and simulated.
    """

    run_report: str = ""
    measured_iteration_ms: float
    predicted_iteration_ms: float
    error_fraction: float  # predicted / measured - 1
    steps: int = 0
    measured_ms_by_device: dict[str, float] = field(default_factory=dict)
    predicted_busy_ms_by_device: dict[str, float] = field(default_factory=dict)
    measured_compute_ms_by_device: dict[str, float] = field(default_factory=dict)
    measured_wait_ms_by_device: dict[str, float] = field(default_factory=dict)
    measured_cpu_ms_by_device: dict[str, float] = field(default_factory=dict)
    # device -> category (compute, communication, update, idle) -> ms: the simulated
    # iteration's, and the median over the run's measured steps of the device's
    predicted_breakdown_ms_by_device: dict[str, dict[str, float]] = field(default_factory=dict)
    measured_breakdown_ms_by_device: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.measured_iteration_ms >= 0, "measured_iteration_ms must be >= 0")


@record
class SimReport:
    kind: str = "sim-report"
    schema_version: int = SCHEMA_VERSION
    planner: str
    plan_sha256: str
    graph_sha256: str
    topology_sha256: str
    model: str = ""
    topology: str = ""
    microbatches: int = 1
    iteration_ms: float
    planner_prediction_ms: float | None = None
    feasible: bool
    tasks: int
    compute_tasks: int
    transfers: int
    collectives: int
    compute_ms: float
    comm_ms: float
    comm_hidden_fraction: float
    critical_path_ms: float
    devices: tuple[DeviceUsage, ...]
    links: tuple[LinkUsage, ...] = ()
    overflows: tuple[Overflow, ...] = ()
    critical_path: tuple[CriticalStep, ...] = ()
    comparison: Comparison | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(self.iteration_ms >= 0, f"iteration_ms must be >= 0, got {self.iteration_ms}")
        check(0 <= self.comm_hidden_fraction <= 1 + 1e-9,
              f"comm_hidden_fraction must be in [0, 1], got {self.comm_hidden_fraction}")
        check(self.feasible == (not self.overflows),
              "feasible must be true exactly when there is no overflow")
