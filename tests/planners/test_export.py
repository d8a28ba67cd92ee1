"""`plan export --format torch-pipelining`: split points and a schedule CSV torch accepts."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from dl_nfv.artifacts import BadInput, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import run
from dl_nfv.planners.export import torch_pipelining
from dl_nfv.planners.schedules import Schedule
from tests.planners.test_pipeline import GIB, chain, nvlink


def test_export_of_a_gpipe_plan_by_hand():
    graph = chain(6, param_bytes=GIB)
    plan = run("1f1b", graph, nvlink(3), microbatches=4)
    files = torch_pipelining(plan, graph)
    rows = files["schedule.csv"].splitlines()
    assert rows == [",".join(t.split()) for t in Schedule.from_pipeline(plan.pipeline, plan.groups).texts()]
    assert rows[2] == "2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3"
    manifest = json.loads(files["split_points.json"])
    assert manifest["split_spec"] == {"layers.2": "beginning", "layers.4": "beginning"}
    assert [s["modules"] for s in manifest["stages"]] == [["layers.0", "layers.1"],
                                                          ["layers.2", "layers.3"],
                                                          ["layers.4", "layers.5"]]
    assert manifest["microbatches"] == 4 and manifest["schedule_kind"] == "1f1b"
    assert manifest["caveats"] == []


@pytest.mark.parametrize("split", [False, True])
def test_torch_loads_the_exported_csv(split):
    # with the input-gradient FLOPs profiled the plan splits backwards into I and W, which
    # torch's schedules name the same way (BACKWARD_INPUT, BACKWARD_WEIGHT)
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    graph = chain(8, param_bytes=GIB)
    if split:
        graph = dataclasses.replace(graph, ops=tuple(
            dataclasses.replace(op, bwd_flops=4e9, bwd_input_flops=2e9) for op in graph.ops))
    plan = run("pipeline", graph, nvlink(4), microbatches=8, max_stages=4)
    files = torch_pipelining(plan, graph)
    assert ("I" in files["schedule.csv"]) == split
    actions = {rank: [schedules._Action.from_str(c) for c in line.split(",")]
               for rank, line in enumerate(files["schedule.csv"].splitlines())}
    stages = len(plan.pipeline.stages)
    schedules._validate_schedule(actions, len(actions), stages, 8)
    manifest = json.loads(files["split_points.json"])
    rank_of = {s["stage"]: s["rank"] for s in manifest["stages"]}
    with_comms = schedules._add_send_recv(actions, stage_to_rank=rank_of.__getitem__,
                                          num_stages=stages)
    schedules._simulate_comms_compute(with_comms, stage_to_rank=rank_of.__getitem__,
                                      num_stages=stages)


def test_unequal_replication_is_stated():
    graph = chain(4, param_bytes=GIB)
    plan = run("pipeline", graph, nvlink(2))
    from dataclasses import replace

    from dl_nfv.artifacts import Group, Pipeline

    groups = (Group(id="a", ops=("l0", "l1"), devices=("h/gpu0",)),
              Group(id="b", ops=("l2", "l3"), devices=("h/gpu1", "h/gpu2"), batch_shares=(0.75, 0.25)))
    pipe = Pipeline(microbatches=1, stages=("a", "b"),
                    schedule={"h/gpu0": "0F0 0B0", "h/gpu1": "1F0 1B0", "h/gpu2": "1F0 1B0"})
    odd = replace(plan, groups=groups, pipeline=pipe, fusion=None)
    caveats = json.loads(torch_pipelining(odd, graph)["split_points.json"])["caveats"]
    assert any("different numbers of devices ([1, 2])" in c for c in caveats)
    assert any("uneven batch shares" in c for c in caveats)


def test_a_split_tie_is_stated_with_how_the_plan_sums_it():
    from tests.planners.test_pipeline_scheduler import _looked_up, _tied

    graph = _looked_up(_tied(chain(4, param_bytes=GIB), GIB // 4))
    plan = run("pipeline", graph, nvlink(4), max_stages=4, microbatches=2)
    assert plan.tie_sync.value == "exchange" and len(plan.pipeline.stages) >= 2
    caveats = json.loads(torch_pipelining(plan, graph)["split_points.json"])["caveats"]
    assert any("tied weights ['layers.0.weight']" in c and "by exchange" in c for c in caveats)
    gpipe = run("gpipe", graph, nvlink(4), microbatches=2)
    caveats = json.loads(torch_pipelining(gpipe, graph)["split_points.json"])["caveats"]
    assert any("by AllReduce" in c for c in caveats)


def test_a_plan_without_pipeline_is_refused():
    graph = chain(4, param_bytes=2**20)
    plan = run("dp", graph, nvlink(2))
    with pytest.raises(BadInput, match="has no pipeline"):
        torch_pipelining(plan, graph)


def test_cli_export(tmp_path):
    g, t, p, out = tmp_path / "g.json", tmp_path / "t.yaml", tmp_path / "p.json", tmp_path / "exp"
    save(chain(6, param_bytes=GIB), g)
    save(nvlink(3), t)
    runner = CliRunner()
    result = runner.invoke(cli, ["plan", "gpipe", "--graph", str(g), "--topology", str(t), "-o", str(p)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["plan", "export", str(p), "--format", "torch-pipelining", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(x.name for x in out.iterdir()) == ["README.md", "schedule.csv", "split_points.json"]
    assert (out / "schedule.csv").read_text().splitlines()[0].startswith("0F0,0F1")
    result = runner.invoke(cli, ["plan", "export", str(g), "-o", str(out)])
    assert result.exit_code == 2 and "error:" in result.output
    small = chain(6, param_bytes=2**20)
    save(small, g)
    save(run("dp", small, nvlink(3)), p)
    result = runner.invoke(cli, ["plan", "export", str(p), "--graph", str(g), "-o", str(out)])
    assert result.exit_code == 2 and "has no pipeline" in result.output
