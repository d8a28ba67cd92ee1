"""Fused regions compute what their eager ops compute; train's AllReduce calls follow the
plan's buckets (order and membership), counted on two gloo processes."""

from __future__ import annotations

import copy
import json
import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

from dl_nfv.artifacts import Fusion
from dl_nfv.planners.disco.fusible import maximal_groups
from dl_nfv.profilers import profile_model
from dl_nfv.profilers.capture import capture
from dl_nfv.profilers.zoo import instantiate, model_ref
from dl_nfv.runtime.fusion import fuse_partition
from dl_nfv.runtime.partition import probe, split

from .helpers import devices, dp_plan, topology, write


def _graph(name: str, batch: int):
    return profile_model(model_ref(name, batch_size=batch), granularity="op", repeats=1, span_s=0.0,
                         batch_scaling=False)


def _one_unit(name: str, batch: int):
    """The traced model cut into one unit holding every op (data parallelism)."""
    workload = instantiate(model_ref(name, batch_size=batch), seed=0)
    inputs = workload.make_batch(batch, 0)[0]
    cap = capture(workload.module, inputs)
    unit_of = {op: "all" for op in cap.op_ids if op not in cap.input_ops}
    info = probe(cap.graph_module, lambda rows: workload.make_batch(rows, 0)[0])
    return cap, split(cap.graph_module, cap.op_of, unit_of, info, {"all": (("d",), (1.0,))}), inputs


def _outputs_and_grads(module, inputs):
    module.zero_grad(set_to_none=True)
    outs = module(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum(o.float().sum() for o in outs if o.is_floating_point()).backward()
    return [o.detach().clone() for o in outs], [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("name, batch", [("mlp-tiny", 4), pytest.param("resnet50-tiny", 4, marks=pytest.mark.slow)])
def test_fused_regions_equal_the_eager_ops(name, batch):
    graph = _graph(name, batch)
    groups = maximal_groups(graph)
    assert groups
    cap, partition, inputs = _one_unit(name, batch)
    unit = partition.units["all"]
    eager = copy.deepcopy(unit.module)
    fused = fuse_partition(partition, cap, groups, backend=None)
    assert len(fused.regions["all"]) == sum(
        1 for g in groups if sum(len(cap.nodes_of[op]) for op in g) >= 2)
    assert not fused.compiled and not fused.notes
    # the parameters are the same objects, so buckets and the optimizer still see them
    assert {id(p) for p in unit.module.parameters()} == {id(p) for p in cap.graph_module.parameters()}
    outs, grads = _outputs_and_grads(unit.module, inputs)
    ref_outs, ref_grads = _outputs_and_grads(eager, inputs)
    for a, b in zip(outs + grads, ref_outs + ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_regions_equal_the_eager_ops():
    # torch.compile (inductor, C++ on the CPU): minutes on a loaded machine
    graph = _graph("mlp-tiny", 4)
    cap, partition, inputs = _one_unit("mlp-tiny", 4)
    eager = copy.deepcopy(partition.units["all"].module)
    fused = fuse_partition(partition, cap, maximal_groups(graph), backend="inductor")
    outs, grads = _outputs_and_grads(partition.units["all"].module, inputs)
    ref_outs, ref_grads = _outputs_and_grads(eager, inputs)
    assert fused.compiled, fused.notes
    assert len(fused.notes) == 1 and "ran as regions compiled by torch.compile" in fused.notes[0]
    for a, b in zip(outs + grads, ref_outs + ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_an_unavailable_backend_runs_the_regions_eagerly_with_a_note():
    graph = _graph("mlp-tiny", 4)
    cap, partition, inputs = _one_unit("mlp-tiny", 4)
    eager = copy.deepcopy(partition.units["all"].module)
    fused = fuse_partition(partition, cap, maximal_groups(graph), backend="no-such-backend")
    assert not fused.compiled
    assert len(fused.notes) == 1 and "ran eagerly" in fused.notes[0]
    outs, _ = _outputs_and_grads(partition.units["all"].module, inputs)
    ref_outs, _ = _outputs_and_grads(eager, inputs)
    torch.testing.assert_close(outs, ref_outs)


def _count_allreduces(rank: int, world: int, port: int, plan_path: str, out: str) -> None:
    """One training step of the plan on this rank, every ``dist.all_reduce`` counted."""
    import torch.distributed as dist

    from dl_nfv.runtime.comm import Comm
    from dl_nfv.runtime.executor import PlanExecutor, RankContext
    from dl_nfv.runtime.inputs import load_inputs
    from dl_nfv.runtime.model import build_workload, synthetic_batches

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    plan, graph, _, _ = load_inputs(plan_path, None, None)
    calls: list[int] = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    ctx = RankContext(rank=rank, world_size=world, device_name=plan.devices[rank],
                      torch_device=torch.device("cpu"), rank_of={d: i for i, d in enumerate(plan.devices)},
                      comm=Comm(rank, torch.device("cpu")))
    workload = build_workload(graph.model, 0)
    executor = PlanExecutor(plan, graph, workload, ctx, fusion_backend=None)
    inputs, target = next(synthetic_batches(workload, plan.batch_size, 0))
    executor.step(tuple(inputs), target)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(calls, f)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over loopback")
def test_train_all_reduces_in_the_plans_buckets_and_order(tmp_path):
    graph = _graph("mlp-tiny", 4)
    params = {op.id: op.param_bytes // 4 for op in graph.ops if op.param_bytes}
    assert set(params) == {"layers_fc0", "layers_fc1", "head"}
    topo = topology(2)
    # not DDP's reverse order: fc1 alone first, then head with fc0 (ready last)
    buckets = (("layers_fc1",), ("head", "layers_fc0"))
    plan = dp_plan(graph, topo, devices(2))
    plan = type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__},
                         "fusion": Fusion(op_groups=maximal_groups(graph), gradient_buckets=buckets)})
    path = write(tmp_path, graph, topo, plan)
    mp.start_processes(_count_allreduces, args=(2, _free_port(), str(path), str(tmp_path)),
                       nprocs=2, start_method="spawn")
    expected = [params["layers_fc1"], params["head"] + params["layers_fc0"]]
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected
