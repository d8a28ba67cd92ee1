"""Plans the runtime runs: every registered planner, on zoo models and user models, passes
``validate_plan`` and then trains for real (``train``, 2 steps, ``local-cpu``).

The user models are what zoo models lack: the fidelity bench's top-2 Mixture of
Experts (``bench/models/moe.py``: ``torch.topk``, ``torch.where``, ``index_add``: tuples
and shapes that depend on the data) and residual blocks that ``torch.chunk`` their
input (``user_models.py``). Graphs are profiled
for real (one repetition). By default both user models run with every planner; the
zoo's ``-tiny`` models with every planner need ``--runslow`` (profiling the zoo alone
takes minutes on two cores). The one skip: ``exact`` on a graph past its limits
(too many contiguous cut points to enumerate), which it refuses by design. The converse holds too: plans that split what the runtime
keeps together are refused by ``validate_plan`` and by the runtime alike.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from dl_nfv.artifacts import BadInput, Group, InvalidArtifact, SyncMethod, load, save
from dl_nfv.planners import PLANNERS, run
from dl_nfv.planners.validate import validate_plan
from dl_nfv.runtime.launcher import train
from dl_nfv.runtime.worker import WorkerOptions
from tests.conftest import EXAMPLES

USER_MODELS = Path(__file__).resolve().parent / "user_models.py"
BENCH_MOE = Path(__file__).resolve().parents[2] / "bench" / "models" / "moe.py"
USER = {"moe": (f"{BENCH_MOE}:build", (32, 256)),
        "chunked-residual": (f"{USER_MODELS}:chunked_residual", (16, 4, 8))}
TOPOLOGY = EXAMPLES / "topologies" / "local-cpu.yaml"
STEPS = 2


def _zoo_tiny() -> list[str]:
    from dl_nfv.profilers import zoo

    return sorted(n for n in zoo.ZOO if n.endswith("-tiny"))


class Graphs:
    """Op graphs profiled on first use (one repetition), kept for the module."""

    def __init__(self) -> None:
        self._graphs: dict[str, object] = {}

    def __getitem__(self, name: str):
        if name not in self._graphs:
            from dl_nfv.profilers import profile_model, zoo

            if name in USER:
                ref = zoo.model_ref(USER[name][0], input_shapes=[USER[name][1]])
            else:
                ref = zoo.model_ref(name)
            self._graphs[name] = profile_model(ref, granularity="op", repeats=1, warmup=0, span_s=0.0,
                                               batch_scaling=False)
        return self._graphs[name]


@pytest.fixture(scope="module")
def graphs() -> Graphs:
    return Graphs()


def _train(tmp_path: Path, plan, graph, topology, **options):
    """Write the three artifacts and run ``train`` on them; returns the run report."""
    save(graph, tmp_path / "graph.json")
    save(topology, tmp_path / "topology.yaml")
    plan = dataclasses.replace(plan, graph_path=str(tmp_path / "graph.json"),
                               topology_path=str(tmp_path / "topology.yaml"))
    save(plan, tmp_path / "plan.json")
    return train(WorkerOptions(plan=str(tmp_path / "plan.json"), steps=STEPS, warmup=0,
                               threads=1, timeout_s=60, **options), start_method="forkserver")


def _plan_validate_train(tmp_path: Path, graph, planner: str):
    from dl_nfv.planners.exact.blocks import ExactLimit

    topology = load(TOPOLOGY)
    try:
        plan = run(planner, graph, topology)
    except ExactLimit as exc:  # the exact planner's stated limits (ideals, time), exit 2
        pytest.skip(f"{planner} cannot plan {graph.model.name}: {exc}")
    validate_plan(plan, graph, topology, check_fingerprints=True)
    report = _train(tmp_path, plan, graph, topology)
    assert report.steps == STEPS and report.world_size == len(plan.devices)
    assert len(report.losses) == STEPS and all(math.isfinite(x) for x in report.losses)
    return plan, report


# plans whose fused regions the runtime compiles with torch.compile (tens of seconds a run on
# two cores); one stays in the default suite, the rest run with --runslow, and
# tests/runtime/test_fusion.py checks compiled regions against the eager ops
COMPILED = {("moe", "disco"), ("moe", "dp-xla-like"), ("chunked-residual", "dp-xla-like")}


def _cases(models, slow: bool):
    return [pytest.param(m, p, marks=(pytest.mark.slow,) if slow or (m, p) in COMPILED else (),
                         id=f"{m}-{p}") for m in models for p in PLANNERS]


@pytest.mark.parametrize(("model", "planner"), _cases(USER, slow=False))
def test_every_planner_plans_user_models_the_runtime_runs(tmp_path, graphs, model, planner):
    _plan_validate_train(tmp_path, graphs[model], planner)


@pytest.mark.parametrize(("model", "planner"), _cases(_zoo_tiny(), slow=True))
def test_every_planner_plans_zoo_models_the_runtime_runs(tmp_path, graphs, model, planner):
    _plan_validate_train(tmp_path, graphs[model], planner)


def test_the_profiler_colocates_what_the_runtime_keeps_together(graphs):
    # MoE: topk's tuple with its two getitems; per expert, torch.where's tuple, its row
    # indices (as many as the samples routed there: a shape that depends on the data) and
    # everything computed from them up to the index_add that scatters them back.
    groups = [set(g) for g in graphs["moe"].colocation]
    assert {"topk", "getitem", "getitem_1"} in groups
    for e in range(4):
        (group,) = [g for g in groups if f"experts_{e}_0" in g]
        assert {f"experts_{e}_0", f"experts_{e}_1", f"experts_{e}_2"} <= group
        assert len([o for o in group if o.startswith("where")]) == 1
        assert len([o for o in group if o.startswith("index_add")]) == 1
    assert len(groups) == 5
    # chunked residual: each block's chunk with its two halves, nothing else
    assert [set(g) for g in graphs["chunked-residual"].colocation] == [
        {"chunk", "getitem", "getitem_1"}, {"chunk_1", "getitem_2", "getitem_3"},
        {"chunk_2", "getitem_4", "getitem_5"}]


def _experts_dominate(graph):
    """The MoE graph with each expert op timed at 5 ms forward and 10 ms backward on every
    profiled device: the step is the experts' work, so placing them apart is what any
    list scheduler must do, however noisy the one-repetition profile was."""
    def heavy(op):
        if not op.id.startswith("experts_"):
            return op
        return dataclasses.replace(
            op, fwd_ms={d: 5.0 for d in op.fwd_ms}, bwd_ms={d: 10.0 for d in op.bwd_ms},
            fwd_fixed_ms={}, bwd_fixed_ms={}, fwd_ms_by_threads={}, bwd_ms_by_threads={},
            fwd_fixed_ms_by_threads={}, bwd_fixed_ms_by_threads={})

    return dataclasses.replace(graph, ops=tuple(heavy(op) for op in graph.ops))


def test_fastt_places_moe_experts_apart_and_trains_them_exactly(tmp_path, graphs):
    """The MoE's fastt plan runs the experts on both devices, and its losses and parameters
    are those of a single-process run of the same model, seed and batches."""
    from dl_nfv.runtime.reference import reference_run

    graph = _experts_dominate(graphs["moe"])
    topology = load(TOPOLOGY)
    plan = run("fastt", graph, topology, split_critical=False)
    experts = {plan.devices_of_op[f"experts_{e}_0"] for e in range(4)}
    assert len(experts) == 2
    params = tmp_path / "params"
    params.mkdir()
    report = _train(tmp_path, plan, graph, topology, save_params=str(params))
    ref = reference_run(graph.model, steps=STEPS, batch_size=plan.batch_size)
    torch.testing.assert_close(torch.tensor(report.losses, dtype=torch.float64),
                               torch.tensor(ref.losses, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    held = {}
    for rank in range(report.world_size):
        held.update(torch.load(params / f"rank{rank}.pt"))
    assert set(held) == set(ref.parameters)
    for name, value in held.items():
        torch.testing.assert_close(value, ref.parameters[name], rtol=1e-4, atol=1e-5)


def test_a_plan_that_parts_a_tuple_from_its_getitem_is_refused_by_both(tmp_path, graphs):
    """The fault that was: fastt put a getitem of ``torch.where``'s tuple on the other device
    than the tuple; the runtime runs such a getitem with its tuple, so that device's order
    lacked it. Both the validator and the runtime now refuse the plan, naming the op."""
    graph = graphs["moe"]
    topology = load(TOPOLOGY)
    plan = run("m-etf", graph, topology)
    where = next(g for g in graph.colocation if g[0] == "where_2")
    getitem = where[1]
    home = plan.devices_of_op[getitem][0]
    other = next(d for d in plan.devices if d != home)
    groups = [dataclasses.replace(g, ops=tuple(o for o in g.ops if o != getitem))
              for g in plan.groups]
    groups = [g for g in groups if g.ops]
    groups.append(Group(id="moved", ops=(getitem,), devices=(other,), sync=SyncMethod.NONE))
    order = {d: tuple(o for o in ops if o != getitem) for d, ops in plan.order.items()}
    order[other] = tuple(op for op in graph.topological_ids()
                         if op == getitem or op in order.get(other, ()))
    moved = dataclasses.replace(plan, groups=tuple(groups), order=order)
    with pytest.raises(InvalidArtifact, match=f"{getitem}|where_2"):
        validate_plan(moved, graph, topology)
    with pytest.raises(BadInput, match=getitem):
        _train(tmp_path, moved, graph, topology)


def test_colocated_ops_with_other_batch_shares_are_refused_by_both(tmp_path, graphs):
    """Data parallel over both devices with even shares, but the ``torch.where`` of one
    expert (and its tuple's getitems) with other shares: its colocation group is on one
    device set, yet the rows of the expert's row indices (a shape that depends on the data)
    would not match, so the validator names the field and the runtime refuses the value."""
    graph = graphs["moe"]
    topology = load(TOPOLOGY)
    devices = ("local/cpu0", "local/cpu1")
    expert = next(g for g in graph.colocation if "experts_1_0" in g)
    routing = expert[:3]  # where_1 and its two getitems
    assert routing[0].startswith("where")
    rest = tuple(op.id for op in graph.ops if op.id not in routing)
    groups = (Group(id="even", ops=rest, devices=devices, batch_shares=(0.5, 0.5),
                    sync=SyncMethod.ALLREDUCE),
              Group(id="uneven", ops=routing, devices=devices, batch_shares=(0.25, 0.75),
                    sync=SyncMethod.NONE))
    plan = dataclasses.replace(run("dp", graph, topology), groups=groups, fusion=None)
    with pytest.raises(InvalidArtifact, match="batch shares") as err:
        validate_plan(plan, graph, topology)
    # the group's first op (where_1) sets the placement; the first op that differs is named
    assert err.value.field == "groups.even.batch_shares"
    assert "'uneven'" in str(err.value) and routing[0] in str(err.value)
    with pytest.raises(BadInput, match="does not follow the batch"):
        _train(tmp_path, plan, graph, topology)


def test_batch_norms_that_need_two_rows_are_found_from_the_graph(graphs):
    """``batch_norm_rows`` reads from the graph's edges and parameters which batch norms
    have one position per channel; the model itself, run with hooks, says the same."""
    from dl_nfv.planners.runnable import batch_norm_rows
    from dl_nfv.profilers import zoo

    graph = graphs["resnet50-tiny"]
    workload = zoo.instantiate(graph.model, seed=0)
    single: set[str] = set()

    def hook(name):
        def record(module, inputs, output):
            if math.prod(output.shape[2:]) == 1:
                single.add(name)
        return record

    for name, module in workload.module.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.register_forward_hook(hook(name))
    workload.module(*workload.make_batch(graph.model.batch_size, 0)[0])
    by_module = {op.module: op.id for op in graph.ops}
    assert single and set(batch_norm_rows(graph)) == {by_module[m] for m in single}


def test_a_pipeline_with_one_row_through_a_batch_norm_is_refused_by_both(tmp_path, graphs):
    """GPipe blind to batch norms (planned on the graph with its norms renamed) takes 4
    microbatches of resnet50-tiny's batch of 4: one row per slice; the last stage's batch
    norms after 1x1 convolutions then see one value per channel, which torch refuses in
    training. The validator names the op and the field; the run fails the same. (GPipe
    itself takes 2: ``test_min_rows``.)"""
    from dl_nfv.artifacts import RuntimeFailure, fingerprint

    graph = graphs["resnet50-tiny"]
    topology = load(TOPOLOGY)
    blind = dataclasses.replace(graph, ops=tuple(dataclasses.replace(op, name="norm")
                                                 if "batchnorm" in op.name.lower() else op
                                                 for op in graph.ops))
    assert run("gpipe", graph, topology).pipeline.microbatches == 2
    plan = dataclasses.replace(run("gpipe", blind, topology), graph_sha256=fingerprint(graph))
    assert plan.pipeline.microbatches == graph.model.batch_size
    with pytest.raises(InvalidArtifact, match="batch norm .* 1 row") as err:
        validate_plan(plan, graph, topology)
    assert err.value.field == "pipeline.microbatches"
    with pytest.raises(RuntimeFailure, match="more than 1 value per channel"):
        _train(tmp_path, plan, graph, topology)


def test_a_model_that_runs_at_one_batch_size_only_gets_no_groups_and_a_note():
    from dl_nfv.profilers import profile_model, zoo

    ref = zoo.model_ref(f"{USER_MODELS}:fixed_batch", input_shapes=[(8, 4, 4)])
    graph = profile_model(ref, repeats=1, warmup=0, batch_scaling=False, span_s=0.0)
    assert graph.colocation == ()
    assert "no colocation groups: the model fails at (2, 3, 5) rows" in graph.profile.note


def test_the_fewest_rows_a_slice_may_hold(graphs):
    from dl_nfv.planners.runnable import min_slice_rows

    assert min_slice_rows(graphs["resnet50-tiny"]) == 2
    assert min_slice_rows(graphs["moe"]) == 1  # no batch norm
