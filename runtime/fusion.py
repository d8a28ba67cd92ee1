"""Fused op groups (``plan.fusion.op_groups``) run as one compiled region each.

Each unit's fx submodule (``partition.Unit.module``) has the nodes of every fused group
it holds pulled into a submodule of their own (``torch.fx``'s ``fuse_by_partitions``:
the group's nodes become one ``call_module``, its inputs and outputs the values that
cross the group's boundary), and that submodule is wrapped by ``torch.compile``
(inductor; on a CPU it generates C++ that the machine's compiler builds) by
``compile_region``. The parameters stay the same objects, so gradient buckets and the optimizer see them as
before, and the region computes what its eager ops compute (to float tolerance: a
compiler may reorder a reduction).

Where compiling is unavailable (``compile_available`` fails: no C++ compiler, an
unsupported backend) every region runs eagerly as one submodule; where one region's
compilation fails on its first call, that region falls back to its eager submodule.
Both are reported as notes (``FusedRegions.notes``), which the run report carries; a
failure never stops training.

On a CPU a region is compiled with AOTAutograd's default partition (the forward as
written, saving for the backward what the backward reads), not inductor's min-cut
rematerialisation: min-cut moves ``threshold_backward``'s comparison into the forward
and saves a boolean mask, and inductor's C++ code stores such a mask one byte at a time
in a scalar loop (``VecMask::store`` to ``bool``, torch 2.13): an add and a ReLU over
1.6M floats took 16 ms compiled against 0.7 ms eager (one thread, CPU time), 0.7 ms
with the default partition; a conv, batch norm and ReLU 7.9 ms against 3.7 ms (3.6 ms).

Limits: a region's backward is compiled lazily by torch on its first backward; a failure
there is not caught. Groups whose ops are not all in one unit are left unfused (a note
says so); ops traced as several fx nodes move together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

COMPILE_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError, ImportError,
                                                   AssertionError, NotImplementedError)


def compile_errors() -> tuple[type[BaseException], ...]:
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:  # pragma: no cover - torch without dynamo
        return COMPILE_ERRORS
    return (*COMPILE_ERRORS, TorchDynamoException)


@dataclass
class FusedRegions:
    """What fusing did: regions per unit, whether they are compiled, and the notes."""

    regions: dict[str, list[str]] = field(default_factory=dict)  # unit -> submodule names
    compiled: bool = False
    notes: list[str] = field(default_factory=list)


class Region(torch.nn.Module):
    """One fused group: the compiled submodule, or its eager twin where compiling fails."""

    def __init__(self, eager: fx.GraphModule, compiled: Callable | None, name: str,
                 notes: list[str]):
        super().__init__()
        self.eager = eager
        self._compiled = compiled
        self._name = name
        self._notes = notes

    def forward(self, *args):
        if self._compiled is not None:
            try:
                return self._compiled(*args)
            except compile_errors() as exc:
                self._notes.append(f"fused region {self._name} ran eagerly: compiling it failed "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                self._compiled = None
        return self.eager(*args)


def compile_region(module: Callable, backend: str = "inductor") -> Callable:
    """``torch.compile(module, backend=backend)``; for inductor with the default partition
    on a CPU module (module docstring). Compilation happens on the first call."""
    if backend != "inductor" or _on_gpu(module):
        return torch.compile(module, backend=backend)
    return torch.compile(module, backend=backend,
                         options={"custom_partitioner_fn": _default_partition()})


def _on_gpu(module) -> bool:
    tensors = [*module.parameters(), *module.buffers()] if isinstance(module, torch.nn.Module) else []
    return any(t.device.type != "cpu" for t in tensors)


def _default_partition():
    return __getattr__("DefaultPartition")()


_lazy: dict[str, type] = {}


def __getattr__(name: str):
    """``DefaultPartition``, built on first use (importing inductor takes seconds) and
    reachable by name, so that inductor's cache can pickle it."""
    if name != "DefaultPartition":
        raise AttributeError(name)
    if name not in _lazy:
        from torch._functorch.partitioners import default_partition
        from torch._inductor.custom_graph_pass import CustomPartitionerFn

        class DefaultPartition(CustomPartitionerFn):
            """AOTAutograd's default partition behind inductor's joint-graph passes."""

            def __call__(self, gm, joint_inputs, **kwargs):
                kwargs.pop("compiler", None)
                return default_partition(gm, joint_inputs, **kwargs)

            def uuid(self):
                return "dl-nfv-default-partition-1"

        DefaultPartition.__module__ = __name__
        DefaultPartition.__qualname__ = "DefaultPartition"
        _lazy[name] = DefaultPartition
    return _lazy[name]


def compile_available(backend: str = "inductor") -> str | None:
    """None where ``torch.compile`` with ``backend`` compiles and runs a small function
    forward and backward here; else why not, in one line."""
    def f(x, w):
        return torch.relu(x @ w + 1.0)

    try:
        x = torch.randn(4, 4, requires_grad=True)
        w = torch.randn(4, 4, requires_grad=True)
        compiled = compile_region(f, backend)
        out = compiled(x, w)
        out.sum().backward()
        if not torch.allclose(out, f(x, w), atol=1e-5):
            return f"torch.compile ({backend}) gave a different result on a test function"
    except compile_errors() as exc:
        return f"torch.compile ({backend}) is unavailable: {type(exc).__name__}: " \
               f"{str(exc).splitlines()[0][:120] if str(exc) else ''}"
    return None


def fuse_unit(gm: fx.GraphModule, groups: Sequence[Sequence[str]],
              nodes_of: dict[str, Sequence[str]], *, compile_with: str | None,
              notes: list[str], unit: str = "") -> tuple[fx.GraphModule, list[str]]:
    """``gm`` with each group (op ids; ``nodes_of`` maps an op to its fx node names) that
    has at least two nodes in ``gm`` pulled into a ``Region``; the regions' names.
    ``compile_with``: the ``torch.compile`` backend, or None to run the regions eagerly."""
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    by_name = {n.name: n for n in gm.graph.nodes}
    partitions = []
    for ops in groups:
        nodes = [by_name[n] for op in ops for n in nodes_of.get(op, ()) if n in by_name]
        if len(nodes) >= 2:
            partitions.append(dict.fromkeys(nodes))
    if not partitions:
        return gm, []
    fused = fuse_by_partitions(gm, partitions, prefix="fused_")
    names = sorted(name for name, _ in fused.named_children() if name.startswith("fused_"))
    for name in names:
        sub = getattr(fused, name)
        label = f"{unit}.{name}" if unit else name
        compiled = compile_region(sub, compile_with) if compile_with else None
        setattr(fused, name, Region(sub, compiled, label, notes))
    fused.recompile()
    return fused, names


def fuse_partition(partition, capture, op_groups: Iterable[Sequence[str]], *,
                   backend: str | None = "inductor") -> FusedRegions:
    """Replace every unit's module of ``partition`` by its fused form (``fuse_unit``), for
    the plan's ``op_groups`` (``capture``: the traced model, ``Capture.nodes_of``).

    ``backend`` None runs the regions eagerly (the fused structure without compiling)."""
    out = FusedRegions()
    groups = [tuple(g) for g in op_groups if len(g) > 1]
    if not groups:
        return out
    unit_of = {op: uid for uid, unit in partition.units.items() for op in unit.ops}
    split = [g for g in groups if len({unit_of.get(op) for op in g}) > 1]
    if split:
        out.notes.append(f"{len(split)} fused group(s) span units and ran unfused "
                         f"(first: {list(split[0])})")
    if backend is not None:
        why = compile_available(backend)
        if why is not None:
            out.notes.append(f"fused groups ran eagerly, one submodule each: {why}")
            backend = None
    out.compiled = backend is not None
    for uid, unit in partition.units.items():
        mine = [g for g in groups if g not in split and unit_of.get(g[0]) == uid]
        unit.module, names = fuse_unit(unit.module, mine, capture.nodes_of, compile_with=backend,
                                       notes=out.notes, unit=uid)
        if names:
            out.regions[uid] = names
    if out.compiled and out.regions:
        count = sum(len(n) for n in out.regions.values())
        out.notes.append(f"{count} fused op group(s) ran as regions compiled by torch.compile "
                         f"({backend}), the first call of each compiling it")
    return out
