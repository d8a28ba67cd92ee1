"""Planners that choose microbatch counts, batch shares and replica sets give no replica a
slice with fewer rows than the graph's batch norms need in training (``min_slice_rows``).

The graph: ``conv -> bn -> head``, the batch norm with 8 channels (two affine parameters
of 8 floats) and 8 floats per sample out of it, so one value per channel and row: it needs
2 rows a slice. The same graph with the norm renamed has no such need, and shows what each
planner chose before the rule (a one-row slice). On a V100 the chain takes 60 + 3 + 3 ms
per iteration (forward and backward), on a T4 twice that.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from click.testing import CliRunner

from dl_nfv.artifacts import InfeasiblePlan, from_document, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import run
from dl_nfv.planners.runnable import min_slice_rows, slice_rows
from dl_nfv.planners.validate import validate_plan

from .test_listsched import PAIR, T4, V100, graph_of, op

EIGHT = {
    "kind": "topology", "schema_version": 1, "name": "v100x8",
    "hosts": [{"name": "h", "devices": [{"type": "V100-16GB"}] * 8,
               "interconnect": {"kind": "nvlink", "bandwidth_gbps": 80, "latency_us": 0}}],
}


def _chain(batch: int, norm: bool = True):
    bn = {**op("bn", 1, 2, params=64, bwd=(2, 4), out=1000, split=True), "kind": "norm",
          "name": "BatchNorm2d" if norm else "Scale"}
    ops = [op("conv", 20, 40, params=4096, bwd=(40, 80), out=1000, split=True), bn,
           op("head", 1, 2, params=64, bwd=(2, 4), out=100)]
    return graph_of(ops, [("conv", "bn", batch * 32), ("bn", "head", batch * 32)], batch=batch)


def _fewest_rows(plan) -> int:
    return min(c for per in slice_rows(plan).values() for c in per.values() if c > 0)


def _checked(planner: str, graph, topology_doc, **options):
    topology = from_document(topology_doc)
    plan = run(planner, graph, topology, **options)
    validate_plan(plan, graph, topology)
    return plan


def test_the_chain_needs_two_rows_and_its_renamed_twin_one():
    assert min_slice_rows(_chain(4)) == 2
    assert min_slice_rows(_chain(4, norm=False)) == 1


@pytest.mark.parametrize("planner", ["gpipe", "1f1b"])
def test_gpipe_takes_the_most_microbatches_that_leave_two_rows(planner):
    # two stages: microbatch counts up to 4 x 2 = 8 that divide 4 are 1, 2, 4; the norm-blind
    # rule takes 4 (one row each), the rule takes 2 (4 // 2 = 2 rows)
    assert _checked(planner, _chain(4, norm=False), PAIR).pipeline.microbatches == 4
    plan = _checked(planner, _chain(4), PAIR)
    assert plan.pipeline.microbatches == 2 and _fewest_rows(plan) == 2


@pytest.mark.parametrize("planner", ["gpipe", "1f1b", "pipedream", "exact", "pipeline"])
def test_a_microbatch_count_given_that_leaves_one_row_is_infeasible(planner):
    with pytest.raises(InfeasiblePlan, match=r"batch norm 'bn' needs at least 2 rows .* leaves 1"):
        run(planner, _chain(4), from_document(PAIR), microbatches=4)


@pytest.mark.parametrize("planner", ["gpipe", "pipedream", "exact", "pipeline", "dp", "dp-ps"])
def test_a_batch_of_one_is_infeasible_with_a_batch_norm(planner):
    with pytest.raises(InfeasiblePlan, match=r"batch norm 'bn' needs at least 2 rows"):
        run(planner, _chain(1), from_document(PAIR))


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path):
    g, t = tmp_path / "g.json", tmp_path / "t.yaml"
    save(_chain(1), g)
    t.write_text(yaml.safe_dump(PAIR))
    result = CliRunner().invoke(cli, ["plan", "gpipe", "--graph", str(g), "--topology", str(t),
                                      "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    assert "batch norm 'bn' needs at least 2 rows" in result.output
    assert "Traceback" not in result.output


def test_exact_counts_the_loads_at_the_microbatches_that_leave_two_rows():
    # as gpipe: at most 4 x 2 devices, dividing 4 and leaving 2 rows: 2 (norm-blind: 4)
    assert _checked("exact", _chain(4, norm=False), PAIR).pipeline.microbatches == 4
    plan = _checked("exact", _chain(4), PAIR)
    assert plan.pipeline.microbatches == 2 and _fewest_rows(plan) == 2


def test_pipedream_stops_microbatching_where_a_replica_would_get_one_row():
    # two machines: the whole chain on both (66 / 2 = 33 ms) beats any split (conv alone
    # takes 60); then microbatches up to 4 x 1 stage dividing 4 whose microbatch leaves
    # both even replicas a row (4 // m >= 2): 2, one row each; with the norm: 4 // m >= 4: 1
    blind = _checked("pipedream", _chain(4, norm=False), PAIR)
    assert blind.pipeline.microbatches == 2 and _fewest_rows(blind) == 1
    plan = _checked("pipedream", _chain(4), PAIR)
    assert [g.devices for g in plan.groups] == [(V100, T4)]
    assert plan.pipeline.microbatches == 1 and _fewest_rows(plan) == 2


def test_pipedream_replicates_a_stage_on_no_more_devices_than_rows_allow():
    # eight equal machines, a batch of 8: the chain on all eight (66 / 8 ms) beats every
    # split (conv alone on 7 takes 60 / 7); one microbatch (8 // m >= 8), one row a replica.
    # With the norm a stage may take 8 // 2 = 4 machines: conv on 4 (15 ms) is the best
    # bottleneck (the chain on 4 takes 16.5), one microbatch (8 // m >= 4 x 2), 2 rows each
    blind = _checked("pipedream", _chain(8, norm=False), EIGHT)
    assert len(blind.groups) == 1 and len(blind.groups[0].devices) == 8
    assert blind.pipeline.microbatches == 1 and _fewest_rows(blind) == 1
    plan = _checked("pipedream", _chain(8), EIGHT)
    assert len(plan.group_of_op["conv"].devices) == 4
    assert max(len(g.devices) for g in plan.groups) == 4
    assert plan.pipeline.microbatches == 1 and _fewest_rows(plan) == 2


def test_dp_leaves_out_a_device_its_speed_would_give_one_row():
    # by speed (V100 twice a T4) 4 samples split 8/3 : 4/3, largest remainder 3 : 1; the
    # T4's one row is too few, so it is left out and the V100 takes all 4
    blind = _checked("dp", _chain(4, norm=False), PAIR)
    assert blind.groups[0].devices == (V100, T4) and _fewest_rows(blind) == 1
    for planner in ("dp", "dp-ps"):
        plan = _checked(planner, _chain(4), PAIR)
        assert plan.groups[0].devices == (V100,) and _fewest_rows(plan) == 4


def test_even_dp_over_eight_devices_keeps_two_with_two_rows_each():
    # 4 samples evenly over 8 devices: one each for the first four. Leaving out the last of
    # the fewest-row devices one at a time: 8 -> 7 devices (one each for four), ..., 4 (one
    # each), 3 (2, 1, 1), 2 (2, 2): the first two
    names = [f"h/gpu{k}" for k in range(8)]
    blind = _checked("dp-even", _chain(4, norm=False), EIGHT)
    assert blind.groups[0].devices == tuple(names[:4]) and _fewest_rows(blind) == 1
    for planner, options in (("dp-even", {}), ("dp", {"balance": "even", "sync": "ps"})):
        plan = _checked(planner, _chain(4), EIGHT, **options)
        assert plan.groups[0].devices == tuple(names[:2])
        assert plan.groups[0].batch_shares == (0.5, 0.5)


def test_the_pipeline_search_skips_layouts_that_leave_a_replica_one_row():
    # both devices as one stage at one microbatch: shares by time 3 : 1 (as dp), so the
    # screen drops it; microbatch counts leave 2 rows (4 // m >= 2: 1 and 2)
    from dl_nfv.planners.pipeline.partition import Layout, StageSpec
    from dl_nfv.planners.pipeline.problem import Problem
    from dl_nfv.planners.pipeline.search import microbatch_options, screen

    graph, topology = _chain(4), from_document(PAIR)
    problem = Problem(graph, topology)
    assert problem.min_rows == 2
    assert microbatch_options(4, 0, problem.min_rows) == [1, 2]
    both = Layout((StageSpec(0, problem.n, (V100, T4)),), 1, "test")
    blind = Problem(_chain(4, norm=False), topology)
    assert screen(blind, both).reps[0].counts == (3, 1)
    assert screen(problem, both) is None
    plan = _checked("pipeline", graph, PAIR)
    assert _fewest_rows(plan) >= 2


def test_the_pipeline_planner_keeps_two_rows_a_replica_on_eight_devices():
    # a batch of 8: a stage on more than 8 // (m x 2) devices would leave a replica one row
    plan = _checked("pipeline", _chain(8), EIGHT)
    m = plan.pipeline.microbatches if plan.pipeline else 1
    assert max(len(g.devices) for g in plan.groups) <= 8 // m // 2
    assert _fewest_rows(plan) >= 2


def test_the_rule_changes_nothing_without_a_batch_norm():
    # the renamed twin plans as before the rule: the same plan whatever the norm's name,
    # where the norm's rows do not bind (a batch of 64 on two devices, 8 microbatches)
    graph, twin = _chain(64), _chain(64, norm=False)
    for planner in ("gpipe", "pipedream", "exact", "dp"):
        a = run(planner, graph, from_document(PAIR))
        b = run(planner, twin, from_document(PAIR))
        strip = {"wall_time_s": 0.0, "graph_sha256": "0" * 64}
        assert dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip), planner
