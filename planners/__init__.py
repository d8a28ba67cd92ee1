"""Planners: a registry of ``plan(graph, topology, *, seed=0, **options) -> Plan`` functions.

Every planner, research system and baseline alike, has the same signature and
is scored by the same cost model and simulator. Entries are imported on first
use, so listing them is cheap. ``get(name)`` raises ``UnknownName`` listing the
valid names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dl_nfv.artifacts import Collective, Optimizer, UnknownName

# The values of options that mean the same thing in every planner that takes them; the
# command line offers them as choices.
OPTION_CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": tuple(o.value for o in Optimizer),
    "collective": tuple(c.value for c in Collective),
    "sync": ("allreduce", "ps"),
}


@dataclass(frozen=True, slots=True)
class PlannerInfo:
    """One registry entry: where the function lives, preset options, one line on what it decides.

    A preset entry is another entry's function with some options fixed; its command
    hides them (``collective`` is fixed with ``sync: ps``, which has no AllReduce).
    """

    name: str
    target: str  # "module:function", relative to this package
    summary: str
    family: str  # "data-parallel", "pipeline", "placement", "single"
    baseline: bool = False
    preset: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Callable:
        module_name, func = self.target.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module_name}"), func)


PLANNERS: dict[str, PlannerInfo] = {p.name: p for p in (
    PlannerInfo("dp", "dp:plan", "data parallelism over every device, AllReduce, batch shares "
                "by device speed (baseline)", "data-parallel", baseline=True),
    PlannerInfo("dp-ps", "dp:plan", "data parallelism with a parameter server per host "
                "(baseline)", "data-parallel", baseline=True, preset={"sync": "ps",
                                                                  "collective": "auto"}),
    PlannerInfo("dp-even", "dp:plan", "data parallelism over every device, AllReduce, even "
                "batch shares (baseline)", "data-parallel", baseline=True,
                preset={"sync": "allreduce", "balance": "even"}),
    PlannerInfo("dp-prop", "dp:plan", "data parallelism over every device, AllReduce, batch "
                "shares proportional to device speed (baseline)", "data-parallel", baseline=True,
                preset={"sync": "allreduce", "balance": "proportional"}),
    PlannerInfo("ps-even", "dp:plan", "data parallelism with a parameter server per host, even "
                "batch shares (baseline)", "data-parallel", baseline=True,
                preset={"sync": "ps", "collective": "auto", "balance": "even"}),
    PlannerInfo("ps-prop", "dp:plan", "data parallelism with a parameter server per host, batch "
                "shares proportional to device speed (baseline)", "data-parallel", baseline=True,
                preset={"sync": "ps", "collective": "auto", "balance": "proportional"}),
    PlannerInfo("single", "single:plan", "the whole model on the fastest device that fits "
                "(baseline)", "single", baseline=True),
    PlannerInfo("pipeline", "pipeline:plan", "synchronous pipeline: partition, device mapping "
                "over any connectivity, replicated stages, microbatches and schedule", "pipeline"),
    PlannerInfo("exact", "exact:plan", "the optimal contiguous split into single-device stages "
                "(bottleneck load by a DP over the graph's ideals; the yardstick)", "pipeline"),
    PlannerInfo("gpipe", "gpipe:plan_gpipe", "GPipe: even split, one device per stage, fill-drain "
                "schedule (baseline)", "pipeline", baseline=True),
    PlannerInfo("1f1b", "gpipe:plan_1f1b", "1F1B: GPipe's even split with one-forward-one-backward "
                "(baseline)", "pipeline", baseline=True),
    PlannerInfo("pipedream", "pipedream:plan", "PipeDream's hierarchical DP partitioner with stage "
                "replication, 1F1B with a flush (baseline)", "pipeline", baseline=True),
    PlannerInfo("heterog", "heterog:plan", "HeteroG: per op group devices, batch shares and "
                "AllReduce or PS, from a trained GNN policy refined on the simulator", "hybrid"),
    PlannerInfo("tag", "tag.planner:plan", "TAG: per op group devices and replication by a tree "
                "search guided by a GNN over the joint model-and-topology graph, then SFB", "hybrid"),
    PlannerInfo("disco", "disco.planner:plan", "DisCo: data parallelism with op fusion and "
                "gradient buckets chosen jointly by a backtracking search", "data-parallel"),
    PlannerInfo("dp-no-fusion", "disco.baselines:plan_no_fusion", "PyTorch DDP: no op fusion, "
                "25 MiB buckets, the first 1 MiB (baseline)", "data-parallel", baseline=True),
    PlannerInfo("dp-horovod", "disco.baselines:plan_horovod", "Horovod tensor fusion: gradients "
                "ready within a 5 ms cycle fused up to 64 MiB (baseline)", "data-parallel",
                baseline=True),
    PlannerInfo("dp-xla-like", "disco.baselines:plan_xla_like", "greedy maximal op fusion with "
                "DDP's buckets (baseline)", "data-parallel", baseline=True),
    PlannerInfo("fastt", "fastt:plan", "FastT: op placement and execution order by list "
                "scheduling (HEFT/CPOP), critical-path op splitting", "placement"),
    PlannerInfo("m-topo", "baechi:plan_topo", "Baechi m-TOPO: topological fill up to total "
                "memory / devices + largest op (baseline)", "placement", baseline=True),
    PlannerInfo("m-etf", "baechi:plan_etf", "Baechi m-ETF: earliest-task-first list scheduling "
                "with memory checks (baseline)", "placement", baseline=True),
    PlannerInfo("m-sct", "baechi:plan_sct", "Baechi m-SCT: favourite-child LP (PuLP) rounded at "
                "0.5, then ETF (baseline)", "placement", baseline=True),
)}


def register(info: PlannerInfo) -> None:
    """Add a planner to the registry (used by planner modules and by tests)."""
    PLANNERS[info.name] = info


def get(name: str) -> Callable:
    """The plan function of planner ``name``, with its preset options bound."""
    try:
        info = PLANNERS[name]
    except KeyError:
        raise UnknownName(f"unknown planner {name!r}; valid: {', '.join(PLANNERS)}") from None
    func = info.load()
    if not info.preset:
        return func

    def bound(graph, topology, *, seed: int = 0, **options):
        from dataclasses import replace

        plan = func(graph, topology, seed=seed, **{**info.preset, **options})
        return replace(plan, planner=info.name)

    bound.__doc__ = func.__doc__
    bound.__wrapped__ = func  # type: ignore[attr-defined]
    return bound


def run(name: str, graph, topology, *, seed: int = 0, **options):
    """Run planner ``name`` and return its Plan."""
    return get(name)(graph, topology, seed=seed, **options)
