"""The pipeline planner and its baselines: hand-checkable optimum, bounds, validity, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import (
    BadInput,
    Edge,
    InfeasiblePlan,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    from_data,
)
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners import run
from dl_nfv.planners.validate import validate_plan
from dl_nfv.simulator import CostModel, simulate

GIB = 2**30
V100 = "V100-16GB"


def chain(layers: int, *, fwd_ms: float = 10.0, bwd_ms: float = 20.0, param_bytes: int = GIB // 2,
          out_bytes: int = 4 * 2**20, batch: int = 8, name: str = "chain",
          slower: dict[str, float] | None = None) -> OpGraph:
    """``layers`` equal layers in a chain, measured on a V100 (and on the types in ``slower``,
    which take that factor longer)."""
    factors = {V100: 1.0, **(slower or {})}
    ops = tuple(Op(id=f"l{i}", name=f"layers.{i}", kind=OpKind.BLOCK, module=f"layers.{i}",
                   flops=1e9, param_bytes=param_bytes, output_bytes=out_bytes,
                   fwd_ms={t: fwd_ms * k for t, k in factors.items()},
                   bwd_ms={t: bwd_ms * k for t, k in factors.items()}) for i in range(layers))
    edges = tuple(Edge(src=f"l{i}", dst=f"l{i + 1}", bytes=out_bytes) for i in range(layers - 1))
    return OpGraph(model=ModelRef(name=name, source="test", batch_size=batch), ops=ops, edges=edges)


def nvlink(devices: int = 2, device_type: str = V100) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"nvlink{devices}",
        "hosts": [{"name": "h", "devices": [{"type": device_type, "count": devices}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1}}]})


def hosts(count: int, per_host: int, nic_gbps: float, types: tuple[str, ...] = ()) -> Topology:
    """``count`` hosts of ``per_host`` NVLinked GPUs on one switch, ``nic_gbps`` NICs; host
    ``i`` of type ``types[i]`` (V100s by default)."""
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"{count}-hosts",
        "hosts": [{"name": f"h{i}", "devices": [{"type": (types or (V100,) * count)[i],
                                                  "count": per_host}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1},
                   "nics": [{"switch": "sw", "bandwidth_gbps": nic_gbps, "latency_us": 5}]}
                  for i in range(count)],
        "switches": [{"name": "sw"}]})


def test_four_equal_layers_on_two_devices_split_two_and_two():
    """4 layers of 1.5 GiB parameters (4.5 GiB with gradients and momentum) on two 16 GiB
    V100s: all four do not fit one device, so data parallelism is out; the balanced split
    is two layers per device, as many microbatches as samples, and the iteration is the
    closed form of a two-stage pipeline, (m + 1)(f + b) (b with adding the gradients into
    their buckets), plus the optimizer update (and
    sub-millisecond transfers); the stage-balanced bound is at least (m + 1)(f + b). Layers
    are slow enough that adding each microbatch's gradients
    into the buckets (3 passes over 3 GiB per microbatch) does not outweigh the shorter fill
    and drain."""
    graph = chain(4, fwd_ms=100.0, bwd_ms=200.0, param_bytes=3 * GIB // 2)
    topo = nvlink(2)
    plan = run("pipeline", graph, topo)
    pipe = plan.pipeline
    assert pipe is not None and len(pipe.stages) == 2
    groups = {g.id: g for g in plan.groups}
    assert [groups[s].ops for s in pipe.stages] == [("l0", "l1"), ("l2", "l3")]
    assert sorted(len(groups[s].devices) for s in pipe.stages) == [1, 1]
    assert pipe.microbatches == 8
    cm = CostModel(graph, topo)
    dev = groups[pipe.stages[0]].devices[0]
    f = 2 * cm.op_ms("l0", dev, "fwd", 1 / 8)
    b = 2 * cm.op_ms("l0", dev, "bwd", 1 / 8)
    # each backward adds 2 layers of weight gradients into their buckets; the update (SGD
    # with momentum) also zeroes the buckets
    b += 3 * GIB * cm.accumulate_ms_per_byte(dev)
    update = cm.update_ms(3 * GIB, dev) + cm.upkeep_ms(3 * GIB, dev, 0)
    closed = (8 + 1) * (f + b) + update
    assert closed <= plan.prediction.iteration_ms <= closed * 1.01
    # the stage-balanced bound: at least fill and drain (with one sample's activations over
    # the link and its gradient back); at most the larger of that and a stage's compute plus
    # its memory traffic outside the ops (which may overlap the drain; the DP meets such
    # terms on a grid of caps, so it may stop short of them)
    outside = 3 * GIB * (cm.update_ms_per_byte(dev) + cm.upkeep_ms_per_byte(dev, 0))
    devices = cm.cluster.device_names
    hop = 2 * cm.transfer_ms(devices[0], devices[1], 4 * 2**20 / 8)
    fill_drain = (8 + 1) * (f + b) + hop
    assert fill_drain * (1 - 1e-6) <= plan.bound_ms <= max(fill_drain, 8 * (f + b) + outside) * (1 + 1e-6)
    assert plan.bound_ms <= plan.prediction.iteration_ms
    validate_plan(plan, graph, topo)


def test_bound_counts_the_update_after_the_last_backward():
    """Two layers of 3 GiB parameters (9 GiB with gradients and momentum) on two 16 GiB V100s,
    one sample: each layer on its own device, and the iteration is the closed form
    f + f + b + b (the one microbatch there and back, with its transfers) and then the first
    stage's update. The bound has that too: the first stage's last backward waits for the
    round trip, and its update (and zeroing its buckets) comes after it (without it the
    bound was 81.8 ms)."""
    graph = chain(2, fwd_ms=10.0, bwd_ms=20.0, param_bytes=3 * GIB, batch=1)
    topo = nvlink(2)
    plan = run("pipeline", graph, topo)
    assert plan.pipeline is not None and plan.pipeline.microbatches == 1
    cm = CostModel(graph, topo)
    dev = cm.cluster.device_names[0]
    b = cm.op_ms("l0", dev, "bwd") + 3 * GIB * cm.accumulate_ms_per_byte(dev)
    update = cm.update_ms(3 * GIB, dev) + cm.upkeep_ms(3 * GIB, dev, 0)
    hop = 2 * cm.transfer_ms(*cm.cluster.device_names[:2], 4 * 2**20)  # activation and back
    closed = 2 * (cm.op_ms("l0", dev, "fwd") + b) + update + hop
    assert plan.prediction.iteration_ms == pytest.approx(closed, rel=1e-6)
    assert closed * (1 - 1e-4) <= plan.bound_ms <= plan.prediction.iteration_ms


def test_small_model_on_two_devices_is_data_parallel():
    """With tiny parameters nothing beats splitting the batch: one stage on both devices."""
    graph = chain(4, param_bytes=2**20)
    plan = run("pipeline", graph, nvlink(2))
    assert plan.pipeline is None or len(plan.pipeline.stages) == 1
    assert len(plan.groups) == 1 and len(plan.groups[0].devices) == 2
    assert plan.groups[0].shares == pytest.approx((0.5, 0.5))
    dp = run("dp", graph, nvlink(2))
    assert plan.prediction.iteration_ms <= dp.prediction.iteration_ms * 1.0001


def test_heterogeneous_devices_get_uneven_shares_or_layers():
    """A V100 and a P100 measured twice as slow: the faster device gets more of the work."""
    graph = chain(6, param_bytes=GIB, slower={"P100": 2.0})
    topo = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "mixed",
        "hosts": [{"name": "h", "devices": [{"type": V100, "count": 1}, {"type": "P100", "count": 1}],
                   "interconnect": {"kind": "pcie", "bandwidth_gbps": 100, "latency_us": 2}}]})
    plan = run("pipeline", graph, topo)
    sim = simulate(plan, graph, topo, check_fingerprints=False)
    busy = sim.busy_ms
    v100, p100 = "h/gpu0", "h/gpu1"
    cm = CostModel(graph, topo)
    assert cm.op_ms("l0", p100) == 2 * cm.op_ms("l0", v100)
    work_v100 = sum(1 for g in plan.groups if v100 in g.devices for _ in g.ops)
    work_p100 = sum(1 for g in plan.groups if p100 in g.devices for _ in g.ops)
    assert work_v100 >= work_p100
    assert busy[v100] > 0 and busy[p100] > 0
    for name in ("gpipe", "1f1b", "pipedream"):
        other = run(name, graph, topo)
        assert plan.prediction.iteration_ms <= other.prediction.iteration_ms * 1.0001, name


@pytest.mark.parametrize("planner", ["pipeline", "gpipe", "1f1b", "pipedream"])
def test_every_pipeline_planner_gives_a_valid_plan_with_a_bound(planner):
    graph = chain(6, param_bytes=GIB)
    topo = nvlink(4)
    plan = run(planner, graph, topo)
    validate_plan(plan, graph, topo)
    assert plan.planner == planner
    assert 0 < plan.bound_ms <= plan.prediction.iteration_ms
    if plan.pipeline is not None:
        from dl_nfv.planners.schedules import Schedule

        assert Schedule.from_pipeline(plan.pipeline, plan.groups).deadlock_free()


def test_deterministic_for_a_seed():
    graph = chain(8, param_bytes=GIB)
    topo = nvlink(4)
    a = run("pipeline", graph, topo, seed=3)
    b = run("pipeline", graph, topo, seed=3)
    assert a.groups == b.groups and a.pipeline == b.pipeline


def test_time_limit_cuts_the_local_search_and_says_so():
    """A limit the bound alone uses up leaves no time for the ordering search's local moves:
    the plan still comes (valid, from the first orderings and the baselines' layouts), and
    its status says the limit cut it short; with the default limit it is not cut."""
    from dl_nfv.artifacts import PlanStatus

    graph = chain(8, param_bytes=GIB)
    topo = nvlink(4)
    cut = run("pipeline", graph, topo, time_limit=1e-9)
    assert cut.status is PlanStatus.TIME_LIMIT
    validate_plan(cut, graph, topo)
    assert cut.bound_ms <= cut.prediction.iteration_ms
    assert run("pipeline", graph, topo).status is PlanStatus.HEURISTIC


def test_the_search_counts_the_bound_s_time_against_the_plan_s_limit(monkeypatch):
    """The bound is computed first, and the search's cut-offs count its CPU time: the search
    gets the plan's whole limit and the CPU time the plan started at, before the bound."""
    import time

    from dl_nfv.planners.pipeline import planner

    real_bound, real_search, given = planner.pipeline_bound, planner.search, []

    def slow_bound(problem, cpu_s=None):
        spin = time.process_time() + 0.2
        while time.process_time() < spin:
            pass
        return real_bound(problem, cpu_s)

    def search(*args, time_limit, started, **kwargs):
        given.append((time_limit, time.process_time() - started))
        return real_search(*args, time_limit=time_limit, started=started, **kwargs)

    monkeypatch.setattr(planner, "pipeline_bound", slow_bound)
    monkeypatch.setattr(planner, "search", search)
    run("pipeline", chain(8, param_bytes=GIB), nvlink(4), time_limit=5.0)
    assert len(given) == 1
    limit, spent = given[0]
    assert limit == 5.0 and spent >= 0.2


def test_fixed_options_are_obeyed():
    graph = chain(8, param_bytes=GIB)
    topo = nvlink(4)
    plan = run("pipeline", graph, topo, microbatches=4, max_stages=2, schedule="1f1b")
    assert plan.pipeline.microbatches == 4
    assert len(plan.pipeline.stages) <= 2
    assert plan.pipeline.schedule_kind.value == "1f1b"


def test_does_not_fit_even_fully_split():
    graph = chain(4, param_bytes=6 * GIB)  # 18 GiB per layer with gradients and momentum
    with pytest.raises(InfeasiblePlan, match=r"op 'l0' alone needs 18.00 GiB .* \(short by 2.00 GiB\)"):
        run("pipeline", graph, nvlink(2))


def test_does_not_fit_the_cluster_together():
    graph = chain(8, param_bytes=2 * GIB)  # 6 GiB each, 48 GiB in all, 32 GiB of devices
    with pytest.raises(InfeasiblePlan, match=r"needs 48.00 GiB .* have 32.00 GiB together"):
        run("pipeline", graph, nvlink(2))


def test_more_stages_than_ops_and_bad_microbatches():
    graph = chain(4, param_bytes=2**20)
    with pytest.raises(BadInput, match="max_stages 5 exceeds the 4 ops"):
        run("pipeline", graph, nvlink(2), max_stages=5)
    with pytest.raises(BadInput, match="3 microbatches do not divide the batch of 8"):
        run("pipeline", graph, nvlink(2), microbatches=3)
    with pytest.raises(BadInput, match="5 stages for 4 ops"):
        run("gpipe", graph, nvlink(8), stages=5)
    with pytest.raises(BadInput, match="schedule must be one of"):
        run("pipeline", graph, nvlink(2), schedule="zigzag")


def test_cli_exit_code_and_message(tmp_path):
    from click.testing import CliRunner

    from dl_nfv.artifacts import save
    from dl_nfv.cli.main import cli

    g, t = tmp_path / "g.json", tmp_path / "t.yaml"
    save(chain(4, param_bytes=6 * GIB), g)
    save(nvlink(2), t)
    result = CliRunner().invoke(cli, ["plan", "pipeline", "--graph", str(g), "--topology", str(t),
                                       "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2
    assert "op 'l0' alone needs 18.00 GiB" in result.output
    assert "Traceback" not in result.output
    save(chain(4, param_bytes=2**20), g)
    result = CliRunner().invoke(cli, ["plan", "pipeline", "--graph", str(g), "--topology", str(t),
                                       "--microbatches", "3"])
    assert result.exit_code == 2 and "3 microbatches do not divide the batch of 8" in result.output


def test_tied_first_and_last_layers_share_a_host():
    """A weight tied between the first and the last layer (an embedding and its output head)
    is held by both stages and summed by an AllReduce between them each step: on two hosts
    joined by a slow link, the planner folds its device order so that the first and the last
    stage sit on one host, and its own estimate still agrees with the simulator, which lowers
    the tie the same way."""
    tied = GIB // 2
    base = chain(4, fwd_ms=40.0, bwd_ms=80.0, param_bytes=3 * GIB // 2)
    head = dataclasses.replace(base.ops[-1], shared_params={"layers.0.weight": tied})
    first = dataclasses.replace(base.ops[0], params=("layers.0.weight",))
    graph = dataclasses.replace(base, ops=(first, *base.ops[1:-1], head))
    topo = hosts(2, 2, 10)
    cm = CostModel(graph, topo)
    assert [(o, s, b) for _, o, s, b in cm.ties] == [("l0", "l3", tied)]
    plan = run("pipeline", graph, topo, microbatches=8)
    groups = {g.id: g for g in plan.groups}
    stage_of = {op: g for g in plan.groups for op in g.ops}
    host_of = {op: {cm.cluster.device(d).host for d in stage_of[op].devices}
               for op in ("l0", "l3")}
    # one layer per device, both hosts used, the tied layers' stages on one host
    assert len(plan.pipeline.stages) == len(groups) == 4
    assert host_of["l0"] == host_of["l3"] and len(host_of["l0"]) == 1
    sim = simulate(plan, graph, topo, check_fingerprints=False).iteration_ms
    best_own = next(n for n in plan.notes if n.startswith("searched"))
    estimate = float(best_own.rsplit("best own layout ", 1)[1].split(" ms")[0])
    assert sim == pytest.approx(estimate, rel=0.03)
    validate_plan(plan, graph, topo)


def test_the_partition_leaves_a_tie_s_sum_out_of_a_stage_that_holds_only_its_owner():
    from dl_nfv.planners.pipeline.partition import _untied
    from dl_nfv.planners.pipeline.problem import Problem

    tied = GIB // 2
    base = chain(4, fwd_ms=40.0, bwd_ms=80.0, param_bytes=3 * GIB // 2)
    head = dataclasses.replace(base.ops[-1], shared_params={"layers.0.weight": tied})
    first = dataclasses.replace(base.ops[0], params=("layers.0.weight",), tie_sum_ms={V100: 30.0})
    graph = dataclasses.replace(base, ops=(first, *base.ops[1:-1], head))
    untied = _untied(Problem(graph, nvlink(2)))
    # stages [a, b) of the four layers: those holding l0 and not l3 leave its 30 ms out
    expected = {(a, b): 30.0 if a == 0 and 0 < b < 4 else 0.0
                for a in range(5) for b in range(a + 1, 5)}
    assert {ab: float(untied[0][ab]) for ab in expected} == expected


def test_device_runs_start_every_device_up_to_32_and_on_a_grid_beyond():
    from dl_nfv.planners.pipeline.partition import device_slots

    assert device_slots(16) == tuple(range(17))
    assert device_slots(32) == tuple(range(33))
    # pairs, and single devices at both ends (where embeddings, heads and ties are)
    assert device_slots(64) == (0, 1, *range(2, 63, 2), 63, 64)
    assert device_slots(100) == (0, 1, 2, 3, *range(4, 97, 4), 97, 98, 99, 100)
    assert len(device_slots(1000)) - 1 <= 32 + 2 * 31


def test_a_large_cluster_is_partitioned_on_device_slots():
    """64 devices: the DP's tables are over 35 run boundaries (pairs of devices, and single
    devices at both ends of the ordering)."""
    from dl_nfv.planners.pipeline.partition import OrderingTables
    from dl_nfv.planners.pipeline.problem import Problem

    graph, topo = chain(8, batch=64), nvlink(64)
    problem = Problem(graph, topo)
    ordering = tuple(topo.device_names)
    base = OrderingTables(problem, ordering)
    assert base.cuts == (0, 1, *range(2, 63, 2), 63, 64) and base.size.shape == (35, 35)
    assert base.devices(3, 5) == ordering[4:8] and base.devices(0, 1) == ordering[:1]
    assert base.size[3, 5] == 4 and base.size[0, 34] == 64 and base.size[33, 34] == 1
    tables = base.for_microbatches(4)
    least = tables.min_bottleneck()
    layouts = tables.layouts([least, 1.5 * least, 3 * least])
    assert layouts
    for layout in layouts:
        end = 0
        for stage in layout.stages:  # runs between boundaries, in the ordering's order
            start = ordering.index(stage.devices[0])
            stop = start + len(stage.devices)
            assert stage.devices == ordering[start:stop]
            assert start in base.cuts and stop in base.cuts and start >= end
            end = stop
    # a plan of it is valid, no slower than data parallelism over all 64 devices, and no
    # faster than its bound (taken with device counts on a grid on this many devices)
    plan = run("pipeline", graph, topo, time_limit=20)
    validate_plan(plan, graph, topo)
    dp = run("dp", graph, topo)
    ms = simulate(plan, graph, topo).iteration_ms
    assert ms <= simulate(dp, graph, topo).iteration_ms + 1e-6
    assert 0 < plan.bound_ms <= ms


def test_the_family_s_bound_is_computed_once_per_graph_and_topology(monkeypatch):
    from dl_nfv.planners.pipeline import planner as pipeline_planner
    from dl_nfv.planners.pipeline.problem import Problem

    calls = []
    real = pipeline_planner._pipeline_bound
    monkeypatch.setattr(pipeline_planner, "_pipeline_bound",
                        lambda problem, cpu_s=float("inf"): calls.append(1) or real(problem))
    monkeypatch.setattr(pipeline_planner, "_BOUNDS", {})
    graph, topo = chain(4, fwd_ms=100.0, bwd_ms=200.0, param_bytes=3 * GIB // 2), nvlink(2)
    plans = [run(name, graph, topo) for name in ("pipeline", "gpipe", "1f1b", "pipedream")]
    assert len(calls) == 1
    assert len({p.bound_ms for p in plans}) == 1
    first = pipeline_planner.pipeline_bound(Problem(graph, topo))
    first.parts.clear()  # a caller's copy: the one kept is untouched
    assert pipeline_planner.pipeline_bound(Problem(graph, topo)).parts
    assert len(calls) == 1
    # another topology, or a cost model of the caller's, is bounded afresh
    pipeline_planner.pipeline_bound(Problem(graph, nvlink(4)))
    assert len(calls) == 2
    custom = Problem(graph, topo, cost_model=CostModel(graph, topo))
    pipeline_planner.pipeline_bound(custom)
    assert len(calls) == 3


@pytest.mark.parametrize("topology", ["ring8-mixed.yaml", "tag-hetero16.yaml",
                                      "heterog-testbed8.yaml"])
def test_greedy_paths_step_to_the_widest_then_nearest_unvisited_device(topology):
    from dl_nfv.artifacts import load
    from dl_nfv.planners.pipeline.mapping import greedy_path, route_ranks
    from tests.conftest import EXAMPLES

    topo = load(EXAMPLES / "topologies" / topology, expect="topology")
    graph = chain(4)
    cm = CostModel(graph, topo)
    devices = list(topo.device_names)
    ranks = route_ranks(cm, devices)
    for start in devices:
        path, left = [start], [d for d in devices if d != start]
        while left:  # the walk, step by step, by the key itself
            here = path[-1]
            nxt = min(left, key=lambda d: (-cm.cluster.route(here, d).bandwidth_gbps,
                                           cm.cluster.route(here, d).latency_us,
                                           len(cm.cluster.route(here, d).hops), devices.index(d)))
            path.append(nxt)
            left.remove(nxt)
        assert greedy_path(cm, devices, start, ranks) == path == greedy_path(cm, devices, start)


def test_a_bound_cut_by_its_budget_is_a_lower_value_and_refined_for_a_caller_with_more():
    """``pipeline_bound`` with no CPU time to refine returns the least value its counts have
    reached (a bound still, at most the full one); a caller given more time gets the full
    bound, computed again, and it is kept for the next."""
    from dl_nfv.planners.pipeline import planner as pipeline_planner
    from dl_nfv.planners.pipeline.problem import Problem

    graph = chain(8, fwd_ms=10.0, bwd_ms=20.0, param_bytes=GIB // 4)
    topo = nvlink(4)
    full = pipeline_planner._pipeline_bound(Problem(graph, topo))
    cut = pipeline_planner.pipeline_bound(Problem(graph, topo), cpu_s=0.0)
    assert 0 < cut.parts["stage_balanced"] <= full.parts["stage_balanced"] + 1e-9
    assert pipeline_planner.pipeline_bound(Problem(graph, topo), cpu_s=1e9) == full
    assert pipeline_planner.pipeline_bound(Problem(graph, topo), cpu_s=0.0) == full
