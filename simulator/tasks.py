"""The task graph a plan lowers to: compute tasks on devices, communication on links.

A ``TaskGraph`` is a struct of arrays (plain Python lists indexed by task id),
because the engine walks it hundreds of thousands of times per second and
attribute access on per-task objects would dominate. A task is either

* **compute**: runs on one device's compute stream (``device[t] >= 0``), one at
  a time per device, picked by ``priority[t]`` among the ready ones; or
* **communication**: ``device[t] == -1``; it holds every resource in
  ``resources[t]`` (directed links of its route, and for collectives each
  participant's collective stream) for its whole duration. On a
  ``host_driven`` device (a CPU, whose collective library copies and sums on
  the same cores) the device's stream resource also stands for its compute
  stream: while such a task holds it, the device computes nothing.

``succ[t]`` lists the tasks that wait for ``t``; ``ndeps[t]`` counts the tasks
``t`` waits for. ``info[t]`` is a small tuple from which ``describe(t)``
builds a human name on demand (names are never built in the hot path).

Memory is described by **buffers**: ``nbytes`` on a device, allocated when
task ``alloc`` starts and freed when the last of its ``releasers`` ends.
"""

from __future__ import annotations

from enum import IntEnum


class TaskKind(IntEnum):
    FORWARD = 0
    BACKWARD = 1
    UPDATE = 2
    RECOMPUTE = 3  # sufficient-factor gradient recomputation
    TRANSFER = 4  # point-to-point activation or activation-gradient
    ALLREDUCE = 5
    ALLGATHER = 6
    PS_PUSH = 7
    PS_PULL = 8

    @property
    def is_compute(self) -> bool:
        return self <= TaskKind.RECOMPUTE

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    TaskKind.FORWARD: "forward", TaskKind.BACKWARD: "backward", TaskKind.UPDATE: "update",
    TaskKind.RECOMPUTE: "recompute", TaskKind.TRANSFER: "transfer",
    TaskKind.ALLREDUCE: "allreduce", TaskKind.ALLGATHER: "allgather",
    TaskKind.PS_PUSH: "ps-push", TaskKind.PS_PULL: "ps-pull",
}
COMPUTE_KINDS = frozenset(k for k in TaskKind if k.is_compute)


class TaskGraph:
    """Tasks, dependencies, resources and memory buffers of one lowered plan."""

    __slots__ = (
        "kind", "device", "resources", "duration_ms", "priority", "succ", "ndeps", "nbytes",
        "info", "device_names", "resource_names", "n_links", "unit_names", "replica_device",
        "group_ids", "buf_alloc", "buf_device", "buf_bytes", "buf_releasers", "static_bytes",
        "capacity_bytes", "microbatches", "host_driven",
    )

    def __init__(self, device_names: list[str], resource_names: list, n_links: int):
        self.kind: list[int] = []
        self.device: list[int] = []
        self.resources: list[tuple[int, ...]] = []
        self.duration_ms: list[float] = []
        self.priority: list[int] = []
        self.succ: list[list[int]] = []
        self.ndeps: list[int] = []
        self.nbytes: list[float] = []
        self.info: list[tuple] = []
        self.device_names = device_names
        # links first (index < n_links, names are (src, dst) node pairs), then one
        # collective stream per device (names "<device> collectives")
        self.resource_names = resource_names
        self.n_links = n_links
        self.unit_names: list[str] = []
        self.replica_device: list[int] = []
        self.group_ids: list[str] = []
        self.buf_alloc: list[int] = []
        self.buf_device: list[int] = []
        self.buf_bytes: list[float] = []
        self.buf_releasers: list[list[int]] = []
        self.static_bytes: list[float] = [0.0] * len(device_names)
        self.capacity_bytes: list[int] = [0] * len(device_names)
        self.microbatches = 1
        # devices whose communication runs on their own compute cores (CPUs: gloo copies and
        # sums on the worker's cores), so a collective or transfer there holds the device too
        self.host_driven: list[bool] = [False] * len(device_names)

    def __len__(self) -> int:
        return len(self.kind)

    # ------------------------------------------------------------ building
    def add_compute(self, kind: TaskKind, device: int, duration_ms: float, priority: int,
                    info: tuple) -> int:
        t = len(self.kind)
        self.kind.append(kind)
        self.device.append(device)
        self.resources.append(())
        self.duration_ms.append(duration_ms)
        self.priority.append(priority)
        self.succ.append([])
        self.ndeps.append(0)
        self.nbytes.append(0.0)
        self.info.append(info)
        return t

    def add_comm(self, kind: TaskKind, resources: tuple[int, ...], duration_ms: float,
                 nbytes: float, info: tuple) -> int:
        t = len(self.kind)
        self.kind.append(kind)
        self.device.append(-1)
        self.resources.append(resources)
        self.duration_ms.append(duration_ms)
        self.priority.append(0)
        self.succ.append([])
        self.ndeps.append(0)
        self.nbytes.append(nbytes)
        self.info.append(info)
        return t

    def depend(self, before: int, after: int) -> None:
        """``after`` may not start before ``before`` ends."""
        self.succ[before].append(after)
        self.ndeps[after] += 1

    def add_buffer(self, device: int, nbytes: float, alloc: int, releasers: list[int]) -> None:
        if nbytes <= 0:
            return
        self.buf_alloc.append(alloc)
        self.buf_device.append(device)
        self.buf_bytes.append(nbytes)
        self.buf_releasers.append(releasers or [alloc])

    # ------------------------------------------------------------- reading
    def predecessors(self) -> list[list[int]]:
        """``preds[t]``: the tasks ``t`` waits for (built on demand; O(tasks + edges))."""
        preds: list[list[int]] = [[] for _ in self.kind]
        for t, nxt in enumerate(self.succ):
            for s in nxt:
                preds[s].append(t)
        return preds

    def where(self, t: int) -> str:
        """The device a compute task runs on, or ``src -> dst`` / the device set of a transfer."""
        d = self.device[t]
        if d >= 0:
            return self.device_names[d]
        info = self.info[t]
        if self.kind[t] == TaskKind.TRANSFER:
            return f"{self.device_names[info[4]]} -> {self.device_names[info[5]]}"
        return info[1]

    def describe(self, t: int) -> str:
        """A human name: ``forward fc1 mb0``, ``transfer relu->fc2 a/gpu0 -> b/gpu0 mb1``."""
        kind = TaskKind(self.kind[t])
        info = self.info[t]
        if kind in (TaskKind.FORWARD, TaskKind.BACKWARD):
            unit, mb = info[0], info[2]
            label = "weight gradients" if len(info) > 3 else kind.label  # a split backward's W
            return f"{label} {self.unit_names[unit]}" + (
                f" mb{mb}" if self.microbatches > 1 else "")
        if kind == TaskKind.UPDATE:
            return f"update {info[0]}" if info and info[0] else "update"
        if kind == TaskKind.RECOMPUTE:
            return f"recompute gradient {info[0]}"
        if kind == TaskKind.TRANSFER:
            unit, direction, mb, nbytes, _, _ = info
            if isinstance(unit, str):  # not a unit's output: a tie exchange's gradient
                return unit
            what = "activation" if direction == "F" else "gradient"
            return f"{what} {self.unit_names[unit]}" + (
                f" mb{mb}" if self.microbatches > 1 else "")
        return f"{kind.label} {info[0]}"
