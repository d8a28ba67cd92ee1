"""FastT: hand-checked schedules, splitting that only ever helps, memory errors, refinement."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from click.testing import CliRunner

from dl_nfv.artifacts import fingerprint, from_document, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import run
from dl_nfv.simulator import simulate

from .test_listsched import PAIR, T4, V100, diamond, graph_of, op

# Two V100s and a T4 on one host (80 Gbps, no latency): room to split over.
TRIO = {
    "kind": "topology", "schema_version": 1, "name": "trio",
    "hosts": [{"name": "h", "devices": [{"type": "V100-16GB", "count": 2}, {"type": "T4"}],
               "interconnect": {"kind": "nvlink", "bandwidth_gbps": 80, "latency_us": 0}}],
}


def test_fastt_is_at_least_as_good_as_the_hand_computed_heft_schedule():
    graph, topology = diamond(), from_document(PAIR)
    plan = run("fastt", graph, topology)
    # the simulator agrees with the hand-computed HEFT schedule (9.2 ms), and FastT keeps
    # the best candidate
    assert plan.notes[0].startswith("kept: ")
    assert "heft: estimated 9.200 ms, simulated 9.200 ms" in plan.notes[1]
    assert plan.prediction.iteration_ms <= 9.2 + 1e-9
    assert set(plan.order) <= {V100, T4}
    # every device lists exactly the ops it runs
    runs = {d: sorted(o for g in plan.groups if d in g.devices for o in g.ops) for d in plan.order}
    assert {d: sorted(ops) for d, ops in plan.order.items()} == runs
    assert sorted({o for ops in plan.order.values() for o in ops}) == ["A", "B", "C", "D"]
    assert plan.bound_ms <= plan.prediction.iteration_ms


def _big_op_chain(batch=8):
    ops = [op("in", 0.1, 0.2, out=1000),
           op("big", 40, 80, params=4096, bwd=(80, 160), out=1000, split=True),
           op("out", 0.1, 0.2, params=64, bwd=(0.2, 0.4), out=100)]
    return graph_of(ops, [("in", "big", 1000), ("big", "out", 1000)], batch=batch)


def test_splitting_pays_on_a_long_splittable_op_and_is_recorded_in_the_plan():
    graph, topology = _big_op_chain(), from_document(TRIO)
    whole = run("fastt", graph, topology, split_critical=False)
    assert all(len(g.devices) == 1 for g in whole.groups)
    split = run("fastt", graph, topology)
    assert split.prediction.iteration_ms < 0.6 * whole.prediction.iteration_ms
    group = next(g for g in split.groups if "big" in g.ops)
    assert len(group.devices) >= 2 and abs(sum(group.batch_shares) - 1) < 1e-9
    assert ("split" in group.note or "replicated" in group.note) and group.sync.value == "allreduce"
    assert all("big" in split.order[d] for d in group.devices)


def test_critical_path_split_search_keeps_only_what_the_simulator_confirms():
    from dl_nfv.planners.fastt.search import Context, Recipe, split_search
    from dl_nfv.simulator.costs import CostModel

    graph, topology = _big_op_chain(), from_document(TRIO)
    ctx = Context(graph, topology, CostModel(graph, topology), memory_fraction=1.0)
    start = ctx.build(Recipe("heft", "heft", (0, 1, 2)))
    best, log = split_search(ctx, start, max_split=3, rounds=2, ops_per_round=6,
                             deadline=float("inf"))
    assert best.iteration_ms < 0.6 * start.iteration_ms
    assert log and log[0].startswith("round 1: split 'big'")
    group = next(g for g in best.groups if g.id == "split:big")
    assert len(group.devices) >= 2 and "split" in group.note
    assert best.result.iteration_ms == best.iteration_ms


def test_batch_of_one_cannot_be_split():
    plan = run("fastt", _big_op_chain(batch=1), from_document(TRIO))
    assert all(len(g.devices) == 1 for g in plan.groups)


@pytest.mark.parametrize("seed", range(6))
def test_splitting_never_makes_a_plan_slower(seed):
    from .test_listsched import _random_graph

    graph, topology = _random_graph(seed, 18), from_document(TRIO)
    without = run("fastt", graph, topology, split_critical=False)
    with_split = run("fastt", graph, topology, split_critical=True)
    assert with_split.prediction.iteration_ms <= without.prediction.iteration_ms + 1e-9
    # and what the plan claims is what the simulator says
    again = simulate(with_split, graph, topology)
    assert again.iteration_ms == pytest.approx(with_split.prediction.iteration_ms, abs=1e-5)


def test_plans_are_deterministic():
    from .test_listsched import _random_graph

    graph, topology = _random_graph(7, 15), from_document(TRIO)
    a, b = run("fastt", graph, topology), run("fastt", graph, topology)
    assert (a.groups, a.order, a.notes) == (b.groups, b.order, b.notes)


def _write(tmp_path, graph, topology_doc):
    g, t = tmp_path / "g.json", tmp_path / "t.yaml"
    save(graph, g)
    t.write_text(yaml.safe_dump(topology_doc))
    return str(g), str(t)


def test_cli_infeasible_memory_names_the_op_and_the_shortfall(tmp_path):
    # 'huge' holds 8 GiB of parameters: 24 GiB with gradients and momentum, more than a
    # 16 GiB V100 or T4 holds.
    ops = [op("in", 1, 1), op("huge", 1, 1, params=8 * 2**30, bwd=(1, 1)), op("out", 1, 1)]
    graph = graph_of(ops, [("in", "huge", 1000), ("huge", "out", 1000)])
    g, t = _write(tmp_path, graph, PAIR)
    for planner in ("fastt", "m-topo", "m-etf", "m-sct"):
        result = CliRunner().invoke(cli, ["plan", planner, "--graph", g, "--topology", t,
                                          "-o", str(tmp_path / "p.json")])
        assert result.exit_code == 2, (planner, result.output)
        assert "op 'huge'" in result.output and "short by 8.000 GiB" in result.output, result.output
        assert "Traceback" not in result.output


def test_cli_bad_memory_fraction_is_exit_2(tmp_path):
    g, t = _write(tmp_path, diamond(), PAIR)
    result = CliRunner().invoke(cli, ["plan", "fastt", "--graph", g, "--topology", t,
                                      "--memory-fraction", "0"])
    assert result.exit_code == 2 and "memory_fraction must be in (0, 1]" in result.output


def test_cli_writes_a_plan_with_order(tmp_path):
    g, t = _write(tmp_path, _big_op_chain(), TRIO)
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "fastt", "--graph", g, "--topology", t,
                                      "--max-split", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["planner"] == "fastt" and data["order"]
    assert data["options"]["max_split"] == 2
    assert all(len(g["devices"]) <= 2 for g in data["groups"])


def _run_report(plan, path, *, compute_ms, op_fwd_ms=None):
    doc = {"kind": "run-report", "schema_version": 1, "plan_sha256": fingerprint(plan),
           "planner": plan.planner, "plan_path": path, "graph_sha256": plan.graph_sha256,
           "topology_sha256": plan.topology_sha256, "mode": "placement",
           "batch_size": plan.batch_size, "world_size": len(compute_ms),
           "ranks": {d: i for i, d in enumerate(compute_ms)}, "backend": "gloo", "steps": 2,
           "iteration_ms": 10.0,
           "per_rank": [{"rank": i, "device": d, "iteration_ms": [10.0, 10.0], "compute_ms": ms,
                         "wait_ms": 0.0} for i, (d, ms) in enumerate(compute_ms.items())]}
    if op_fwd_ms:
        doc["op_fwd_ms"] = op_fwd_ms
    return from_document(doc)


def test_refine_with_per_rank_compute_scales_a_device_type(tmp_path):
    # A chain with two independent halves: the plan uses both devices; the run finds the
    # T4 ten times slower than predicted, so the refined plan moves work off it.
    ops = [op(f"o{i}", 5, 6, params=4096, bwd=(10, 12)) for i in range(6)]
    edges = [("o0", "o1", 1000), ("o1", "o2", 1000), ("o3", "o4", 1000), ("o4", "o5", 1000)]
    graph = graph_of(ops, edges)
    topology = from_document(PAIR)
    g, t = _write(tmp_path, graph, PAIR)
    first = run("fastt", graph, topology, split_critical=False)
    from dataclasses import replace

    first = replace(first, graph_path="g.json", topology_path="t.yaml")
    save(first, tmp_path / "plan.json")
    busy = simulate(first, graph, topology).busy_ms
    assert busy.get(T4, 0) > 0
    report = _run_report(first, "plan.json",
                         compute_ms={d: ms * (10.0 if d == T4 else 1.0) for d, ms in busy.items()})
    save(report, tmp_path / "run.json")
    refined = run("fastt", graph, topology, split_critical=False,
                  refine_with=str(tmp_path / "run.json"))
    text = " ".join(refined.notes)
    assert "compute on T4 scaled by 10.000" in text and "compute on V100-16GB scaled by 1.000" in text
    assert "transfer costs not refined" in text
    on_t4 = [o for g in refined.groups if T4 in g.devices for o in g.ops]
    assert len(on_t4) < len([o for g in first.groups if T4 in g.devices for o in g.ops])


def test_refine_with_per_op_times_replaces_them(tmp_path):
    graph, topology = diamond(), from_document(PAIR)
    plan = run("fastt", graph, topology, split_critical=False)
    # without a readable plan the per-op times are taken as full-batch times
    report = _run_report(plan, "", compute_ms={V100: 1.0}, op_fwd_ms={"T4": {"B": 50.0}})
    save(report, tmp_path / "run.json")
    refined = run("fastt", graph, topology, split_critical=False,
                  refine_with=str(tmp_path / "run.json"))
    assert any("forward times of 1 ops on T4 replaced" in n for n in refined.notes)
    assert refined.prediction.iteration_ms >= plan.prediction.iteration_ms - 1e-9
    assert T4 not in {d for g in refined.groups if "B" in g.ops for d in g.devices}


def test_refine_with_nothing_usable_is_bad_input(tmp_path):
    graph, topology = diamond(), from_document(PAIR)
    plan = run("fastt", graph, topology)
    save(_run_report(plan, "missing.json", compute_ms={V100: 1.0}), tmp_path / "run.json")
    g, t = _write(tmp_path, graph, PAIR)
    result = CliRunner().invoke(cli, ["plan", "fastt", "--graph", g, "--topology", t,
                                      "--refine-with", str(tmp_path / "run.json")])
    assert result.exit_code == 2 and "nothing to refine" in result.output, result.output


def test_random_graphs_fastt_not_slower_than_baselines():
    from .test_listsched import _random_graph

    rng = random.Random(3)
    for _ in range(3):
        graph, topology = _random_graph(rng.randint(0, 10**6), 20), from_document(TRIO)
        fastt = run("fastt", graph, topology).prediction.iteration_ms
        for name in ("m-topo", "m-etf", "m-sct", "single", "dp"):
            other = run(name, graph, topology).prediction.iteration_ms
            assert fastt <= other * (1 + 1e-9), (name, fastt, other)


def test_rules_that_build_the_same_schedule_are_simulated_once():
    # a diamond on two devices: HEFT with and without look-ahead build one schedule
    graph, topology = diamond(), from_document(PAIR)
    plan = run("fastt", graph, topology, split_critical=False)
    tried = plan.notes[1]
    simulated = tried.count("simulated")
    duplicates = tried.count("the same plan as")
    assert duplicates >= 1
    # every schedule is simulated at most once: simulations = distinct schedules kept
    assert f"{simulated} candidate simulations" in plan.notes[-1]


def test_fastt_keeps_a_colocation_group_on_one_device():
    # HEFT's best schedule of the diamond puts B on the T4 and C on the V100 (9.2 ms);
    # colocated, every candidate keeps them together, and the plan passes the validator
    import dataclasses

    from dl_nfv.planners.validate import validate_plan

    topology = from_document(PAIR)
    blind = run("fastt", diamond(), topology, split_critical=False)
    assert blind.devices_of_op["B"] != blind.devices_of_op["C"]
    graph = dataclasses.replace(diamond(), colocation=(("B", "C"),))
    plan = run("fastt", graph, topology, split_critical=False)
    validate_plan(plan, graph, topology)
    assert plan.devices_of_op["B"] == plan.devices_of_op["C"]


def test_fastt_never_splits_a_colocated_op_apart_from_its_group():
    # 'big' is worth splitting on its own (above); colocated with 'out', the critical-path
    # search leaves it whole, and the data-parallel start replicates the pair alike (same
    # devices, same shares), which is what the runtime needs of them
    import dataclasses

    from dl_nfv.planners.fastt.search import Context, Recipe, split_search
    from dl_nfv.planners.validate import validate_plan
    from dl_nfv.simulator.costs import CostModel

    graph = dataclasses.replace(_big_op_chain(), colocation=(("big", "out"),))
    topology = from_document(TRIO)
    ctx = Context(graph, topology, CostModel(graph, topology), memory_fraction=1.0)
    start = ctx.build(Recipe("heft", "heft", (0, 1, 2)))
    best, log = split_search(ctx, start, max_split=3, rounds=2, ops_per_round=6,
                             deadline=float("inf"))
    assert log == [] and best is start
    plan = run("fastt", graph, topology)
    validate_plan(plan, graph, topology)
    big, out = plan.group_of_op["big"], plan.group_of_op["out"]
    assert dict(zip(big.devices, big.shares)) == dict(zip(out.devices, out.shares))


def _batch_norm_chain(batch=4):
    # conv -> batch norm with 8 channels and one position per channel (8 floats per sample
    # leave it), the norm's two affine parameters 8 floats each -> head
    ops = [op("conv", 20, 40, params=4096, bwd=(40, 80), out=1000, split=True),
           {**op("bn", 1, 2, params=64, bwd=(2, 4), out=1000, split=True),
            "name": "BatchNorm2d", "kind": "norm"},
           op("head", 1, 2, params=64, bwd=(2, 4), out=100)]
    return graph_of(ops, [("conv", "bn", batch * 32), ("bn", "head", batch * 32)], batch=batch)


def test_data_parallel_starts_give_every_replica_the_rows_a_batch_norm_needs():
    # 4 samples over two V100s and a T4 by speed would leave some replica one sample, on
    # which the batch norm sees one value per channel (torch refuses it in training)
    from dl_nfv.planners.fastt.search import Context, data_parallel_starts, sample_counts
    from dl_nfv.planners.runnable import batch_norm_rows
    from dl_nfv.planners.validate import validate_plan
    from dl_nfv.simulator.costs import CostModel

    graph, topology = _batch_norm_chain(), from_document(TRIO)
    assert batch_norm_rows(graph) == {"bn": 2}
    ctx = Context(graph, topology, CostModel(graph, topology), memory_fraction=1.0)
    assert min(c for _, c in sample_counts(4, range(3), ctx.speeds, 1)) == 1
    starts = data_parallel_starts(ctx, max_split=3)
    assert starts
    for _, splits in starts:
        split = splits["bn"]
        assert all(round(s * 4) >= 2 for s in split.shares), split
    plan = run("fastt", graph, topology)
    validate_plan(plan, graph, topology)
