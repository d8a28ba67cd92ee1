"""Single device (baseline): the whole model on the fastest device whose memory holds it.

All ops form one group on one device, so every colocation group of the graph
shares a placement.
"""

from __future__ import annotations

from dl_nfv.artifacts import Group, InfeasiblePlan, OpGraph, SyncMethod, Topology

from .base import GIB, device_speeds, finish, optimizer_named, started
from .bounds import lower_bound


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, optimizer: str = "sgd"):
    """Place every op on the fastest device that fits the model (parameters, gradients,
    optimizer state and the activations of one batch).

    Parameters
    ----------
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Raises ``InfeasiblePlan`` naming the largest device and the shortfall when none fits.
    Complexity: O(ops x devices) plus one simulation.
    """
    t0 = started()
    from dl_nfv.simulator.costs import CostModel

    opt = optimizer_named("single", optimizer)
    cm = CostModel(graph, topology)
    ops = [op.id for op in graph.ops]
    need = cm.replica_bytes(opt.state_factor)
    names = list(cm.cluster.device_names)
    speed = dict(zip(names, device_speeds(cm, names)))
    fitting = [d for d in names if cm.memory_bytes(d) >= need]
    if not fitting:
        largest = max(names, key=cm.memory_bytes)
        d = cm.cluster.device(largest)
        raise InfeasiblePlan(
            f"single: the model needs {need / GIB:.2f} GiB but the largest device {largest!r} "
            f"({d.type.name}) has {d.memory_bytes / GIB:.2f} GiB")
    best = max(fitting, key=lambda d: (speed[d], -names.index(d)))
    group = Group(id="all", ops=tuple(ops), devices=(best,), sync=SyncMethod.NONE)
    return finish(planner="single", graph=graph, topology=topology, groups=[group], seed=seed,
                  options={"optimizer": optimizer}, started_at=t0,
                  bound=lower_bound(cm, [best], ops_splittable=False),  # the whole batch there
                  optimizer=opt, cost_model=cm)
