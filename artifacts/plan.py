"""The ``plan`` artifact: where every op runs, how gradients are synchronised, in what order.

A plan is a list of **groups**: ops that share a placement. A group runs on a
set of devices; with more than one device its ops are replicated and the batch
is split by ``batch_shares`` (even when omitted), and the group's gradients are
synchronised by ``sync`` (``allreduce``, ``ps`` with ``ps_servers``, or
``none``). Every op of the graph is in exactly one group. Data crossing from
one group to another moves between the replicas whose batch intervals overlap.

Optional parts:

* ``pipeline``: the groups that are stages, in order, the microbatch count,
  and each device's action list in the text form of
  torch.distributed.pipelining (``0F0 0F1 0B0 ...``: stage, F/B, microbatch);
* ``order``: each device's op order (op placement planners);
* ``fusion``: fused op kernels and gradient buckets;
* ``prediction``: the simulated iteration time the planner chose it by, and
  ``bound_ms``, the best lower bound the planner knows.

``validate_against(plan, graph, topology)`` checks the plan against the
artifacts it names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import ArtifactMismatch
from .records import check, record, unique

SCHEMA_VERSION = 1
SHARE_TOLERANCE = 1e-6


class SyncMethod(StrEnum):
    ALLREDUCE = "allreduce"
    PS = "ps"
    NONE = "none"


class TieSync(StrEnum):
    """How a tied weight held on several devices has its gradient summed.

    ``allreduce``: one AllReduce over every holder after their last backward.
    ``exchange``: for a weight whose owner is a lookup (an embedding, whose gradient
    only has rows for the batch's tokens) held by two single-device groups: the
    sharer sends its dense gradient to the owner when its group's last backward is
    done, and the owner sends back only its non-zero rows after its own; each adds what
    it receives. Ties that do not qualify are AllReduced.
    """

    ALLREDUCE = "allreduce"
    EXCHANGE = "exchange"


class Collective(StrEnum):
    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"


class Compression(StrEnum):
    NONE = "none"
    SFB = "sfb"  # sufficient-factor broadcasting: all-gather the factors, recompute the gradient


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    HEURISTIC = "heuristic"
    TIME_LIMIT = "time_limit"


class ScheduleKind(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    CUSTOM = "custom"


class Optimizer(StrEnum):
    SGD = "sgd"  # with momentum: one state tensor per parameter
    ADAM = "adam"  # two state tensors per parameter

    @property
    def state_factor(self) -> float:
        return 1.0 if self is Optimizer.SGD else 2.0


@record
class Group:
    id: str
    ops: tuple[str, ...]
    devices: tuple[str, ...]
    batch_shares: tuple[float, ...] = ()
    sync: SyncMethod = SyncMethod.ALLREDUCE
    ps_servers: tuple[str, ...] = ()
    collective: Collective = Collective.AUTO
    compression: Compression = Compression.NONE
    note: str = ""

    def __post_init__(self) -> None:
        check(bool(self.ops), f"group {self.id!r} has no ops")
        check(bool(self.devices), f"group {self.id!r} has no devices")
        unique(self.devices, f"device in group {self.id!r}:")
        unique(self.ops, f"op in group {self.id!r}:")
        if self.batch_shares:
            check(len(self.batch_shares) == len(self.devices),
                  f"group {self.id!r}: {len(self.batch_shares)} batch_shares for "
                  f"{len(self.devices)} devices")
            check(all(s > 0 for s in self.batch_shares),
                  f"group {self.id!r}: batch_shares must be > 0, got {list(self.batch_shares)}")
            total = sum(self.batch_shares)
            check(abs(total - 1.0) <= SHARE_TOLERANCE,
                  f"group {self.id!r}: batch_shares sum to {total:.6g}, not 1")
        if self.sync is SyncMethod.PS:
            check(bool(self.ps_servers), f"group {self.id!r}: sync 'ps' needs ps_servers")
        else:
            check(not self.ps_servers, f"group {self.id!r}: ps_servers given but sync is "
                                       f"{self.sync.value!r}")

    @property
    def shares(self) -> tuple[float, ...]:
        """Batch share of each device (even split when none were given)."""
        return self.batch_shares or tuple(1.0 / len(self.devices) for _ in self.devices)


_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One pipeline action: ``stage`` runs forward (F) or backward (B) of ``microbatch``,
    or the backward in two parts, as torch.distributed.pipelining names them: the input
    gradients (I), which the stage sends back, and later the weight gradients (W)."""

    stage: int
    op: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    @property
    def sends_gradients(self) -> bool:
        """B or I: the action whose end lets the stage before run its backward."""
        return self.op in "BI"

    @property
    def ends_backward(self) -> bool:
        """B or W: the action after which the microbatch's weight gradients are complete
        and its stashed activations can go."""
        return self.op in "BW"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION.match(text)
        if not m:
            raise ValueError(f"bad pipeline action {text!r} (expected e.g. 0F3, 2B0, 1I2 or 1W2)")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


# each action's bit, and the bits of what it needs to have run first on its own stage
_BIT = {"F": 1, "B": 2, "I": 4, "W": 8}
_NEEDS = {"F": 0, "B": 1, "I": 1, "W": 4}
_COMPLETE = (1 | 2, 1 | 4 | 8)  # F and B, or F, I and W


def order_problem(actions: Sequence[Action], stages: Iterable[int], microbatches: int) -> str | None:
    """The first way ``actions`` is not a complete order of ``stages`` (each microbatch an F,
    then a B, or an I and later a W), as a phrase; None when it is one. The actions must
    name those stages and microbatches below ``microbatches``. O(actions + stages x
    microbatches): the pipeline planner checks every order it builds."""
    done = {s: [0] * microbatches for s in stages}  # per stage and microbatch: bits run
    for a in actions:
        row, m = done[a.stage], a.microbatch
        have, bit = row[m], _BIT[a.op]
        if have & bit:
            return f"action {a} appears twice"
        need = _NEEDS[a.op]
        if have & need != need:
            return f"{a} comes before {a.stage}{'F' if need == 1 else 'I'}{m}"
        if bit & 6 and have & 6:
            other = "I" if have & 4 else "B"
            return f"{a} and {a.stage}{other}{m} both run the microbatch's backward"
        row[m] = have | bit
    for s in sorted(done):
        for m, have in enumerate(done[s]):
            if have not in _COMPLETE:
                missing = "F" if not have & 1 else "W" if have & 4 else "B"
                return f"lacks action {s}{missing}{m}"
    return None


def parse_schedule(text: str) -> tuple[Action, ...]:
    """Parse ``"0F0 0F1 0B0"`` into actions; ``format_schedule`` is the inverse."""
    return tuple(Action.parse(tok) for tok in text.split())


def format_schedule(actions) -> str:
    return " ".join(str(a) for a in actions)


@record
class Pipeline:
    microbatches: int
    stages: tuple[str, ...]
    schedule_kind: ScheduleKind = ScheduleKind.CUSTOM
    schedule: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.microbatches >= 1, f"microbatches must be >= 1, got {self.microbatches}")
        check(bool(self.stages), "a pipeline needs at least one stage")
        unique(self.stages, "pipeline stage")
        for device, text in self.schedule.items():
            try:
                actions = parse_schedule(text)
            except ValueError as exc:
                raise ValueError(f"schedule of {device!r}: {exc}") from None
            for a in actions:
                check(a.stage < len(self.stages),
                      f"schedule of {device!r}: action {a} names stage {a.stage}, but there are "
                      f"{len(self.stages)} stages")
                check(a.microbatch < self.microbatches,
                      f"schedule of {device!r}: action {a} names microbatch {a.microbatch}, but "
                      f"there are {self.microbatches}")

    def actions(self, device: str) -> tuple[Action, ...]:
        return parse_schedule(self.schedule.get(device, ""))


@record
class Fusion:
    op_groups: tuple[tuple[str, ...], ...] = ()
    gradient_buckets: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        unique((op for g in self.op_groups for op in g), "op in fusion.op_groups:")
        unique((op for b in self.gradient_buckets for op in b), "op in fusion.gradient_buckets:")


@record
class Prediction:
    iteration_ms: float
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.iteration_ms >= 0, f"iteration_ms must be >= 0, got {self.iteration_ms}")


@record
class Plan:
    kind: str = "plan"
    schema_version: int = SCHEMA_VERSION
    planner: str
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    wall_time_s: float = 0.0
    status: PlanStatus = PlanStatus.HEURISTIC
    graph_sha256: str
    topology_sha256: str
    batch_size: int
    optimizer: Optimizer = Optimizer.SGD
    groups: tuple[Group, ...]
    pipeline: Pipeline | None = None
    order: dict[str, tuple[str, ...]] = field(default_factory=dict)
    fusion: Fusion | None = None
    tie_sync: TieSync = TieSync.ALLREDUCE
    prediction: Prediction | None = None
    bound_ms: float | None = None
    notes: tuple[str, ...] = ()
    # Where the graph and topology were read from when the plan was made (relative to the
    # plan file when they were given relative); `simulate`/`train` load them by default.
    graph_path: str = ""
    topology_path: str = ""

    def __post_init__(self) -> None:
        check(bool(self.planner), "planner must not be empty")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.wall_time_s >= 0, f"wall_time_s must be >= 0, got {self.wall_time_s}")
        check(self.bound_ms is None or self.bound_ms >= 0, f"bound_ms must be >= 0, got {self.bound_ms}")
        for name in ("graph_sha256", "topology_sha256"):
            value = getattr(self, name)
            check(re.fullmatch(r"[0-9a-f]{64}", value) is not None,
                  f"{name} must be 64 hex digits, got {value!r}")
        unique((g.id for g in self.groups), "group id")
        unique((op for g in self.groups for op in g.ops), "op placed twice: op")
        placed = self.devices_of_op
        for device, ops in self.order.items():
            unique(ops, f"op in order of {device!r}:")
            for op in ops:
                check(op in placed, f"order of {device!r} names op {op!r}, which no group holds")
                check(device in placed[op],
                      f"order of {device!r} names op {op!r}, which runs on {list(placed[op])}")
        if self.pipeline is not None:
            self._check_pipeline(self.pipeline)

    def _check_pipeline(self, pipe: Pipeline) -> None:
        groups = {g.id: g for g in self.groups}
        for sid in pipe.stages:
            check(sid in groups, f"pipeline stage {sid!r} is not a group")
        check(self.batch_size % pipe.microbatches == 0,
              f"batch_size {self.batch_size} is not divisible by {pipe.microbatches} microbatches")
        expected: dict[str, set[int]] = {}  # device -> the stages it runs
        for s, sid in enumerate(pipe.stages):
            for device in groups[sid].devices:
                expected.setdefault(device, set()).add(s)
        for device, stages in expected.items():
            actions = pipe.actions(device)
            extra = next((a for a in actions if a.stage not in stages), None)
            check(extra is None, lambda: f"schedule of {device!r} has action {extra} of a stage "
                                         f"it does not run")
            problem = order_problem(actions, stages, pipe.microbatches)
            check(problem is None, lambda: f"schedule of {device!r}: {problem}")
        for device in pipe.schedule:
            check(device in expected, f"schedule given for {device!r}, which runs no stage")

    @property
    def devices_of_op(self) -> dict[str, tuple[str, ...]]:
        return {op: g.devices for g in self.groups for op in g.ops}

    @property
    def group_of_op(self) -> dict[str, Group]:
        return {op: g for g in self.groups for op in g.ops}

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device the plan uses, in first-use order."""
        seen: dict[str, None] = {}
        for g in self.groups:
            for d in g.devices:
                seen.setdefault(d)
            for d in g.ps_servers:
                seen.setdefault(d)
        return tuple(seen)


def validate_against(plan: Plan, graph, topology, *, check_fingerprints: bool = True) -> None:
    """Check that ``plan`` fits ``graph`` (an OpGraph) and ``topology``.

    Raises ``ArtifactMismatch`` naming the first op, device or fingerprint that
    does not match.
    """
    from .io import fingerprint
    from .topology import cluster_of

    if check_fingerprints:
        for what, artifact, recorded in (("graph", graph, plan.graph_sha256),
                                         ("topology", topology, plan.topology_sha256)):
            actual = fingerprint(artifact)
            if actual != recorded:
                raise ArtifactMismatch(
                    f"the plan was made for a {what} with sha256 {recorded[:12]}..., but this "
                    f"{what} has sha256 {actual[:12]}...; re-plan, or pass the {what} it was made for")
    ops = {op.id for op in graph.ops}
    placed = plan.devices_of_op
    for op in placed:
        if op not in ops:
            raise ArtifactMismatch(f"the plan places op {op!r}, which the graph "
                                   f"{graph.model.name!r} does not have")
    for op in graph.ops:
        if op.id not in placed:
            raise ArtifactMismatch(f"op {op.id!r} of the graph is in no group of the plan")
    if plan.batch_size != graph.model.batch_size:
        raise ArtifactMismatch(f"the plan's batch_size {plan.batch_size} differs from the graph's "
                               f"{graph.model.batch_size}")
    known = set(cluster_of(topology).device_names)
    for device in plan.devices:
        if device not in known:
            raise ArtifactMismatch(f"the plan uses device {device!r}, which topology "
                                   f"{topology.name!r} does not have")
