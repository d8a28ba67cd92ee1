"""The pipeline planner at cluster scale: symmetry of uniform clusters, plans that never get
worse with more devices or more time, and the work of planning a 256-device cluster."""

from __future__ import annotations

import itertools

import pytest

from dl_nfv.artifacts import Collective, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners import run
from dl_nfv.planners.pipeline.symmetry import (
    canonical,
    collective_key,
    nested_hosts,
    sub_topology,
    uniform_labels,
)
from dl_nfv.planners.validate import validate_plan
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.costs import NetworkCosts

from .test_pipeline import GIB, chain

A100 = "A100-40GB"


def leaf_spine(hosts: int, per_host: int, per_leaf: int, names=None, types=None) -> Topology:
    """``hosts`` hosts of ``per_host`` NVLinked GPUs, ``per_leaf`` to a leaf switch, the
    leaves on one spine; host ``i`` is named ``names[i]`` and of type ``types[i]``."""
    names = names or [f"h{i}" for i in range(hosts)]
    leaves = -(-hosts // per_leaf)
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"ls{hosts}x{per_host}",
        "hosts": [{"name": names[i], "devices": [{"type": (types or [A100] * hosts)[i],
                                                    "count": per_host}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 2400, "latency_us": 1},
                   "nics": [{"switch": f"leaf{i // per_leaf}", "bandwidth_gbps": 200,
                             "latency_us": 5}]} for i in range(hosts)],
        "switches": [{"name": f"leaf{k}"} for k in range(leaves)] + [{"name": "spine"}],
        "links": [{"endpoints": [f"leaf{k}", "spine"], "bandwidth_gbps": 400, "latency_us": 5}
                  for k in range(leaves)]})


def test_uniform_clusters_are_recognised_and_mixed_ones_are_not():
    labels = uniform_labels(leaf_spine(4, 2, 2))
    assert labels["h3/gpu1"] == ("leaf1", "h3")
    assert uniform_labels(leaf_spine(4, 2, 2, types=[A100, A100, A100, "V100-16GB"])) is None
    assert uniform_labels(leaf_spine(3, 2, 2)) is None  # leaves of 2 and 1 hosts
    assert canonical(labels, ["h2/gpu0", "h3/gpu1", "h0/gpu0"]) == ((0, 0), (0, 1), (1, 2))
    assert nested_hosts(leaf_spine(8, 2, 2)) == 4 and nested_hosts(leaf_spine(12, 2, 2)) == 6
    assert nested_hosts(leaf_spine(4, 2, 4)) == 1 and nested_hosts(leaf_spine(1, 2, 2)) == 0


def test_collective_key_classes_have_equal_allreduce_costs():
    """Every group of a uniform cluster, whose host names interleave its leaves (so the cost
    model's name-ordered rings cross leaves differently for groups alike in shape): groups
    with one key have the same affine AllReduce cost for every algorithm (the cache is exact),
    and the key does merge groups (it is coarser than the device set)."""
    topo = leaf_spine(4, 2, 2, names=["a", "c", "b", "d"])
    labels = uniform_labels(topo)
    net = NetworkCosts(topo)
    devices = topo.device_names
    seen: dict[tuple, tuple] = {}
    groups = 0
    for size in range(2, len(devices) + 1):
        for group in itertools.combinations(devices, size):
            groups += 1
            costs = tuple(x for alg in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL)
                          for x in net.allreduce_affine(group, alg))
            key = collective_key(net, labels, group)
            assert seen.setdefault(key, costs) == pytest.approx(costs, rel=1e-12, abs=1e-15)
    assert len(seen) < groups / 4


def test_a_sub_cluster_plan_simulates_alike_on_the_whole_cluster():
    graph = chain(6, param_bytes=GIB // 4)
    big = leaf_spine(4, 2, 2)
    small = sub_topology(big, 2)
    assert [h.name for h in small.hosts] == ["h0", "h1"]
    plan = run("pipeline", graph, small)
    on_big = dataclasses_replace_fingerprint(plan, graph, big)
    assert simulate(on_big, graph, big).iteration_ms == pytest.approx(
        plan.prediction.iteration_ms, rel=1e-6)


def dataclasses_replace_fingerprint(plan, graph, topology):
    import dataclasses

    from dl_nfv.artifacts import fingerprint

    return dataclasses.replace(plan, graph_sha256=fingerprint(graph),
                               topology_sha256=fingerprint(topology))


def test_more_devices_never_give_a_worse_plan():
    """Clusters of 1, 2 and 4 hosts, each the first hosts of the next: the plan of each is
    no slower than the one before (the smaller cluster's plan is a candidate of the larger)."""
    graph = chain(6, param_bytes=GIB // 4, batch=8)
    times = []
    for hosts in (1, 2, 4):
        topo = leaf_spine(hosts, 2, 2)
        plan = run("pipeline", graph, topo)
        validate_plan(plan, graph, topo)
        times.append(plan.prediction.iteration_ms)
    assert times[1] <= times[0] + 1e-9 and times[2] <= times[1] + 1e-9


@pytest.mark.parametrize("uniform", [True, False])
def test_more_time_never_gives_a_worse_plan(uniform):
    """A limit that cuts every step it can (the local search, the climbs) against one that
    cuts none: the second keeps every draft the first makes, so it is no slower."""
    graph = chain(8, param_bytes=GIB // 2)
    types = None if uniform else [A100, A100, "V100-16GB"]
    topo = leaf_spine(3 if not uniform else 2, 2, 4, types=types)
    cut = run("pipeline", graph, topo, time_limit=1e-9)
    full = run("pipeline", graph, topo, time_limit=60.0)
    assert full.prediction.iteration_ms <= cut.prediction.iteration_ms + 1e-9


@pytest.mark.slow
def test_planning_256_devices_builds_a_bounded_number_of_collective_costs(monkeypatch):
    """A small graph on 32 hosts of 8 GPUs (four to a leaf), planned with the whole chain of
    nested sub-clusters (16, 8, 4 and 1 hosts): the AllReduce cost expressions the cost
    model builds (the planner's costliest queries) are counted, per class of device groups,
    and each is asked for several times over. A regression guard on the work (about 11,000
    built, of about 38,000 asked; without the classes every ask builds one), not a time."""
    built, asked = set(), [0]
    real = CostModel._expression

    def counted(self, name, devices, root=""):
        if name in ("ring", "tree", "hierarchical"):
            built.add((id(self.class_terms), name, devices, root))
        return real(self, name, devices, root)

    real_terms = CostModel._allreduce_terms

    def asking(self, name, devices):
        asked[0] += 1
        return real_terms(self, name, devices)

    monkeypatch.setattr(CostModel, "_expression", counted)
    monkeypatch.setattr(CostModel, "_allreduce_terms", asking)
    graph = chain(4, param_bytes=GIB // 8, batch=16)
    topo = leaf_spine(32, 8, 4)
    plan = run("pipeline", graph, topo, time_limit=600.0)
    validate_plan(plan, graph, topo)
    assert len(built) < 15000
    assert asked[0] > 3 * len(built)
