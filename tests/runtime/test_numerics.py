"""Every execution mode, run for real on worker processes, matches a single-process run.

Each test trains a tiny zoo model for 3 steps under a hand-written plan and
compares the losses of every step and every parameter after the last step
with ``reference_run`` (same model, seed, global batches and optimizer, one
process, full batch).

Tolerances (float32): the distributed runs sum the same gradients in another
order (over replicas, microbatches, buckets), so values differ by rounding
only: losses within rtol 1e-5 / atol 1e-6, parameters within rtol 1e-4 /
atol 1e-5 after 3 steps (SGD with momentum; Adam normalises each gradient
element, which can magnify rounding on near-zero gradients, hence the same
looser parameter bound for it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from dl_nfv.artifacts import Fusion, Optimizer, SyncMethod, TieSync
from dl_nfv.runtime.launcher import train
from dl_nfv.runtime.reference import reference_run
from dl_nfv.runtime.worker import WorkerOptions
from dl_nfv.simulator.costs import lookup_rows

from .helpers import (
    MODELS,
    compute_ops,
    devices,
    dp_plan,
    graph_of,
    pipeline_plan,
    placement_plan,
    topology,
    with_parameters,
    write,
)

STEPS = 3
LOSS_TOL = {"rtol": 1e-5, "atol": 1e-6}
PARAM_TOL = {"rtol": 1e-4, "atol": 1e-5}


def gpt2_tiny():
    """The tiny GPT-2 (tied embedding and head, dropout off: its random masks differ between
    a microbatched and a full-batch run) on 4 sequences of 8 token ids."""
    return graph_of(f"{MODELS}:gpt2_tiny_without_dropout", input_shapes=[(4, 8)],
                    input_dtypes=["int64"])


def _check(tmp_path: Path, graph, topo, plan, *, optimizer=Optimizer.SGD):
    path = write(tmp_path, graph, topo, plan)
    params_dir = tmp_path / "params"
    params_dir.mkdir()
    report = train(WorkerOptions(plan=str(path), steps=STEPS, warmup=0, threads=1,
                                 save_params=str(params_dir), timeout_s=60),
                   start_method="forkserver")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker
    try:
        ref = reference_run(graph.model, steps=STEPS, batch_size=plan.batch_size, optimizer=optimizer)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(torch.tensor(report.losses, dtype=torch.float64),
                               torch.tensor(ref.losses, dtype=torch.float64), **LOSS_TOL)
    seen = set()
    for rank in range(report.world_size):
        held = torch.load(params_dir / f"rank{rank}.pt")
        for name, value in held.items():
            torch.testing.assert_close(value, ref.parameters[name], **PARAM_TOL,
                                       msg=lambda m, name=name, rank=rank: f"rank {rank} {name}: {m}")
            seen.add(name)
    assert seen == set(ref.parameters), sorted(set(ref.parameters) - seen)
    # the run moved the parameters: the comparison is not between two untouched models
    assert report.losses[0] != report.losses[-1]
    return report


def test_data_parallel_heterogeneous_shares_and_buckets(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    plan = dp_plan(graph, topo, devices(2), shares=(0.75, 0.25), buckets=3)
    report = _check(tmp_path, graph, topo, plan)
    assert report.mode.value == "data-parallel"


def test_parameter_server_with_adam(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    d = devices(2)
    plan = dp_plan(graph, topo, d, sync=SyncMethod.PS, servers=(d[1],), buckets=3,
                   optimizer="adam")
    report = _check(tmp_path, graph, topo, plan, optimizer=Optimizer.ADAM)
    assert report.mode.value == "parameter-server"


def test_pipeline_gpipe(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    d = devices(2)
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=4, kind="gpipe")
    _check(tmp_path, graph, topo, plan)


def test_pipeline_1f1b_with_tied_weights(tmp_path):
    # GPT-2 ties the token embedding (stage 0) to the output head (stage 1): the two
    # stages' gradients of that weight are summed across devices
    graph = gpt2_tiny()
    topo = topology(2)
    d = devices(2)
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=2, kind="1f1b")
    _check(tmp_path, graph, topo, plan)


def test_pipeline_with_a_tie_summed_by_exchange(tmp_path):
    # the embedding is a lookup of the ids (its gradient has rows only for the 32 ids of a
    # batch, of 96), so the head's dense gradient goes to stage 0 and those rows come back
    graph = with_parameters(gpt2_tiny())
    (owner,) = lookup_rows(graph)
    assert lookup_rows(graph)[owner] < graph.index[owner].param_bytes
    topo = topology(2)
    d = devices(2)
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=2, kind="1f1b")
    _check(tmp_path, graph, topo, dataclasses.replace(plan, tie_sync=TieSync.EXCHANGE))


def test_pipeline_custom_order_two_stages_per_device(tmp_path):
    # stages 0 and 2 on cpu0, stage 1 on cpu1, in an order no built-in schedule uses
    graph, topo = graph_of("mlp-tiny", batch_size=6), topology(2)
    d = devices(2)
    schedule = {d[0]: "0F0 0F1 0F2 2F0 2B0 2F1 0B0 2F2 2B1 0B1 2B2 0B2",
                d[1]: "1F0 1F1 1B0 1F2 1B1 1B2"}
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]], [d[0]]], cuts=[0.3, 0.6], microbatches=3,
                         kind="custom", schedule=schedule)
    _check(tmp_path, graph, topo, plan)


def test_pipeline_with_a_replicated_stage(tmp_path):
    # stage 0 replicated on two devices with uneven shares, stage 1 on a third
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(3)
    d = devices(3)
    plan = pipeline_plan(graph, topo, [[d[0], d[1]], [d[2]]], microbatches=2, kind="1f1b",
                         shares=[(0.75, 0.25), None])
    _check(tmp_path, graph, topo, plan)


def test_pipeline_with_a_replicated_first_stage_in_small_buckets(tmp_path):
    # as the pipeline planner makes a first stage of few parameters: one bucket per layer,
    # each AllReduced as soon as the last microbatch's backward has produced it
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(3)
    d = devices(3)
    plan = pipeline_plan(graph, topo, [[d[0], d[1]], [d[2]]], cut=4 / 6, microbatches=4,
                         kind="1f1b", shares=[(0.75, 0.25), None])
    assert plan.groups[0].ops[-1] == "layers_fc1"
    plan = dataclasses.replace(plan, fusion=Fusion(gradient_buckets=(("layers_fc1",),
                                                                     ("layers_fc0",))))
    _check(tmp_path, graph, topo, plan)


def test_op_placement(tmp_path):
    # ResNet blocks alternate between devices: residual branches, in-place ReLUs and
    # batch norm (full batch, so its statistics match the reference) cross devices
    graph, topo = graph_of("resnet50-tiny", batch_size=4), topology(2)
    d = devices(2)
    ops = compute_ops(graph)
    device_of = {op: d[(i * 4 // len(ops)) % 2] for i, op in enumerate(ops)}
    plan = placement_plan(graph, topo, device_of)
    report = _check(tmp_path, graph, topo, plan)
    assert report.mode.value == "placement"
    # each quarter of the ops runs as one unit, so no op is timed on its own
    assert set(report.op_fwd_ms.get("cpu", {})) <= set(ops)


def test_pipeline_with_backwards_split_in_input_and_weight_gradients(tmp_path):
    # both stages run I then, later, W: stage 1's weight gradients after stage 0 has its
    # gradients; stage 0 (replicated, uneven shares: its buckets are reduced as their
    # weight gradients complete) has no input needing a gradient, so its I computes nothing
    # and its W the whole backward
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(3)
    d = devices(3)
    first = "0F0 0F1 0I0 0F2 0I1 0W0 0F3 0I2 0W1 0I3 0W2 0W3"
    schedule = {d[0]: first, d[1]: first, d[2]: "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1F3 1I3 1W1 1W2 1W3"}
    plan = pipeline_plan(graph, topo, [[d[0], d[1]], [d[2]]], microbatches=4, kind="custom",
                         shares=[(0.75, 0.25), None], schedule=schedule)
    _check(tmp_path, graph, topo, plan)


def test_pipeline_with_split_backwards_and_tied_weights(tmp_path):
    # GPT-2's head (stage 1) uses the embedding stage 0 owns; stage 1's I sends the hidden
    # states' gradients before its W computes the weights' (attention: several nodes lead
    # to one weight, each held to the gradient it had)
    graph = gpt2_tiny()
    topo = topology(2)
    d = devices(2)
    schedule = {d[0]: "0F0 0F1 0B0 0B1", d[1]: "1F0 1I0 1F1 1I1 1W1 1W0"}
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=2, kind="custom",
                         schedule=schedule)
    _check(tmp_path, graph, topo, plan)
