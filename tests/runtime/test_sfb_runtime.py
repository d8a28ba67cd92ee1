"""SFB at run time: two gloo workers on CPU, the same steps with SFB and with AllReduce.

The parameters after 5 steps agree to 1e-5 relative (the gradient sums differ only in
summation order), and the bytes each rank counts are the closed forms of the ring
algorithms: an all-gather of ``rows x (in + out)`` floats per Linear (plus the row
counts) against an AllReduce of ``in x out + out`` floats.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dl_nfv.artifacts import Compression
from dl_nfv.runtime.launcher import train
from dl_nfv.runtime.sfb import allgather_sent_bytes, allreduce_sent_bytes
from dl_nfv.runtime.worker import WorkerOptions

from .helpers import devices, dp_plan, graph_of, pipeline_plan, topology, write

STEPS = 5
BATCH = 8
LINEARS = ((64, 32), (32, 32), (32, 10))  # mlp-tiny: fc0, fc1, head (in, out)
PARAM_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _run(tmp_path: Path, sfb: bool, pipeline: bool = False):
    if pipeline:  # stage 0 (fc0, fc1) on two devices with shares 0.75 / 0.25, 2 microbatches
        graph, topo = graph_of("mlp-tiny", batch_size=BATCH), topology(3)
        d = devices(3)
        plan = pipeline_plan(graph, topo, [[d[0], d[1]], [d[2]]], cut=4 / 6, microbatches=2,
                             kind="1f1b", shares=[(0.75, 0.25), None])
    else:
        graph, topo = graph_of("mlp-tiny", batch_size=BATCH), topology(2)
        plan = dp_plan(graph, topo, devices(2))
    if sfb:
        plan = dataclasses.replace(plan, groups=tuple(
            dataclasses.replace(g, compression=Compression.SFB) for g in plan.groups))
    tmp_path.mkdir()
    path = write(tmp_path, graph, topo, plan)
    params = tmp_path / "params"
    params.mkdir()
    report = train(WorkerOptions(plan=str(path), steps=STEPS, warmup=0, threads=1,
                                 save_params=str(params), timeout_s=60),
                   start_method="forkserver")
    held = [torch.load(params / f"rank{r}.pt") for r in range(report.world_size)]
    return report, held


@pytest.mark.slow  # two 2-process runs: about 30 s
def test_sfb_matches_allreduce_and_sends_fewer_bytes(tmp_path):
    plain, plain_params = _run(tmp_path / "allreduce", sfb=False)
    sfb, sfb_params = _run(tmp_path / "sfb", sfb=True)
    # numerics: every parameter of every rank, SFB against AllReduce, and the replicas agree
    assert set(sfb_params[0]) == set(plain_params[0]) and len(sfb_params[0]) == 2 * len(LINEARS)
    for rank in range(2):
        for name, value in plain_params[rank].items():
            torch.testing.assert_close(sfb_params[rank][name], value, **PARAM_TOL,
                                       msg=lambda m, name=name: f"rank {rank} {name}: {m}")
    for name, value in sfb_params[0].items():
        assert torch.equal(value, sfb_params[1][name]), name  # same gathered rows, same sums
    assert plain.losses[0] != plain.losses[-1]
    torch.testing.assert_close(torch.tensor(sfb.losses), torch.tensor(plain.losses), **PARAM_TOL)
    # bytes: the ring closed forms, per rank (2 ranks, 4 rows each, float32)
    n, rows = 2, BATCH // 2
    allreduce = allreduce_sent_bytes(sum(i * o + o for i, o in LINEARS) * 4, n)
    factors = sum(allgather_sent_bytes(rows * (i + o) * 4, n) for i, o in LINEARS)
    counts = allgather_sent_bytes(len(LINEARS) * 8, n)
    assert allreduce == (n - 1) * sum(i * o + o for i, o in LINEARS) * 4
    for r in range(2):
        assert plain.per_rank[r].sent_bytes == {"allreduce": allreduce}
        assert sfb.per_rank[r].sent_bytes == {"sfb": factors + counts}
    assert factors + counts < allreduce
    # per layer, SFB sends less whenever the batch is below in x out / (in + out)
    for i, o in LINEARS:
        if BATCH < i * o / (i + o):
            assert allgather_sent_bytes(rows * (i + o) * 4, n) < allreduce_sent_bytes(
                (i * o + o) * 4, n)
    assert not any("uncompressed" in note for note in sfb.notes)


@pytest.mark.slow  # two 3-process runs: about 30 s
def test_sfb_on_a_replicated_pipeline_stage_with_uneven_shares(tmp_path):
    # rank 0 holds 3 rows of each microbatch, rank 1 one: two calls of every layer per step,
    # and rank 1's 2 rows padded to rank 0's 6 in the all-gather
    plain, plain_params = _run(tmp_path / "allreduce", sfb=False, pipeline=True)
    sfb, sfb_params = _run(tmp_path / "sfb", sfb=True, pipeline=True)
    for rank in range(3):
        for name, value in plain_params[rank].items():
            torch.testing.assert_close(sfb_params[rank][name], value, **PARAM_TOL,
                                       msg=lambda m, name=name: f"rank {rank} {name}: {m}")
    stage0 = LINEARS[:2]
    allreduce = allreduce_sent_bytes(sum(i * o + o for i, o in stage0) * 4, 2)
    factors = sum(allgather_sent_bytes(6 * (i + o) * 4, 2) for i, o in stage0)
    counts = allgather_sent_bytes(len(stage0) * 8, 2)
    for r in range(2):
        assert plain.per_rank[r].sent_bytes == {"allreduce": allreduce}
        assert sfb.per_rank[r].sent_bytes == {"sfb": factors + counts}
    assert plain.per_rank[2].sent_bytes == sfb.per_rank[2].sent_bytes == {}


def test_one_rank_rebuilds_autograd_s_gradients_from_its_factors(tmp_path):
    # in-process, a world of one: a Linear called twice in a step on (batch, seq, in) inputs;
    # the gradients rebuilt from the kept rows equal the ones autograd accumulated
    import torch.distributed as dist

    from dl_nfv.runtime.comm import Comm
    from dl_nfv.runtime.sfb import SfbSync

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        layer = torch.nn.Linear(5, 3)
        twin = torch.nn.Linear(5, 3)
        twin.load_state_dict(layer.state_dict())
        sync = SfbSync([layer], ranks=(0,), rank=0, comm=Comm(0, torch.device("cpu")))
        xs = [torch.randn(2, 4, 5), torch.randn(3, 4, 5)]
        sync.zero_grad()
        sum((layer(x) ** 2).sum() for x in xs).backward()
        sum((twin(x) ** 2).sum() for x in xs).backward()
        for p in layer.parameters():  # what reduce writes must come from the factors alone
            p.grad.zero_()
        sync.reduce()
        torch.testing.assert_close(layer.weight.grad, twin.weight.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.bias.grad, twin.bias.grad, rtol=1e-5, atol=1e-6)
        assert sync.sent_bytes == 0  # nothing leaves a world of one
        sync.close()
    finally:
        dist.destroy_process_group()
