"""Partition and unit execution in one process: any cut of a model computes the same gradients.

All units sit on one device here, so values cross units through the local
path (no processes); the cross-process path is covered by test_numerics.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.profilers.capture import capture
from dl_nfv.profilers.zoo import instantiate, model_ref
from dl_nfv.runtime.comm import Comm
from dl_nfv.runtime.model import split_rows
from dl_nfv.runtime.partition import probe, split
from dl_nfv.runtime.session import choose_backend
from dl_nfv.runtime.units import Placement, UnitRunner

from .helpers import MODELS


def _workload(name: str, batch: int):
    if name == "gpt2":
        ref = model_ref(f"{MODELS}:gpt2_tiny_without_dropout", input_shapes=[(batch, 8)],
                        input_dtypes=["int64"])
    else:
        ref = model_ref(name, batch_size=batch)
    return instantiate(ref, seed=3)


def _cut(name: str, cuts: list[float], batch: int):
    """The workload, a batch and the partition of its traced graph cut at ``cuts``
    (fractions of its ops) into units ``u0``, ``u1``, ... (in op order)."""
    w = _workload(name, batch)
    inputs, target = w.make_batch(batch, 7)
    cap = capture(w.module, inputs)
    ops = [o for o in cap.op_ids if o not in cap.input_ops]
    bounds = sorted({0, *[int(c * len(ops)) for c in cuts], len(ops)})
    unit_of_op = {op: f"u{next(i for i, b in enumerate(bounds[1:]) if k < b)}"
                  for k, op in enumerate(ops)}
    info = probe(cap.graph_module, lambda rows: w.make_batch(rows, 1)[0])
    return w, inputs, target, split(cap.graph_module, cap.op_of, unit_of_op, info)


def _grads_by_units(name: str, cuts: list[float], microbatches: int):
    batch = 4
    w, inputs, target, part = _cut(name, cuts, batch)
    runner = UnitRunner(part, {u: Placement(("d0",), (1.0,)) for u in part.units}, device="d0",
                        rank_of={"d0": 0}, microbatches=microbatches, batch_size=batch,
                        comm=Comm(0, torch.device("cpu")), loss_fn=w.loss)
    order = sorted(part.units, key=lambda u: int(u[1:]))
    runner.begin_step(inputs, target)
    for mb in range(microbatches):
        for u in order:
            runner.forward(u, mb)
    for mb in range(microbatches):
        for u in reversed(order):
            runner.backward(u, mb)
    loss = runner.end_step()
    got = {n: p.grad.clone() for n, p in w.module.named_parameters()}
    w.module.zero_grad(set_to_none=True)
    ref_loss = w.loss(w.module(*inputs), target)
    ref_loss.backward()
    want = {n: p.grad.clone() for n, p in w.module.named_parameters()}
    return loss, float(ref_loss.detach()), got, want


@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(["mlp-tiny", "gpt2", "resnet50-tiny"]),
       cuts=st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3))
def test_any_cut_gives_the_full_model_gradients(name, cuts):
    # microbatches only where batch norm does not make them differ from the full batch
    microbatches = 1 if name == "resnet50-tiny" else 2
    loss, ref_loss, got, want = _grads_by_units(name, cuts, microbatches)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6, msg=n)


@given(total=st.integers(0, 500), shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=8))
def test_split_rows_covers_every_row_once(total, shares):
    bounds = split_rows(total, shares)
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    weight = sum(shares)
    for (lo, hi), s in zip(bounds, shares):
        assert abs((hi - lo) - total * s / weight) < 1 + 1e-9


def test_split_rows_exact_fractions():
    assert split_rows(8, (0.75, 0.25)) == [(0, 6), (6, 8)]
    assert split_rows(6, (1 / 3, 1 / 3, 1 / 3)) == [(0, 2), (2, 4), (4, 6)]


@pytest.mark.parametrize("requested, kinds, cuda, count, local, want", [
    ("auto", {"cpu"}, True, 8, 2, "gloo"),  # the plan's devices are CPUs
    ("auto", {"gpu"}, True, 8, 2, "nccl"),
    ("auto", set(), True, 2, 2, "nccl"),  # no topology: CUDA present, a GPU per rank
    ("auto", {"gpu"}, True, 1, 2, "gloo"),  # two ranks cannot share one GPU under NCCL
    ("auto", {"gpu"}, False, 0, 2, "gloo"),
    ("gloo", {"gpu"}, True, 8, 2, "gloo"),
    ("nccl", {"cpu"}, True, 2, 2, "nccl"),
])
def test_backend_choice(requested, kinds, cuda, count, local, want):
    assert choose_backend(requested, kinds, cuda_available=cuda, cuda_devices=count,
                          local_world=local) == want


def test_nccl_without_cuda_is_bad_input():
    from dl_nfv.artifacts import BadInput

    with pytest.raises(BadInput, match="needs CUDA"):
        choose_backend("nccl", {"gpu"}, cuda_available=False, cuda_devices=0, local_world=1)


class _RecordingComm(Comm):
    """A Comm whose peers are absent: a receive records its (shape, dtype, src, tag) and
    gives zeros; a send is dropped."""

    def __init__(self):
        super().__init__(0, torch.device("cpu"))
        self.made: list[tuple] = []

    def isend(self, tensor, dst, tag):
        pass

    def recv(self, shape, dtype, src, tag):
        self.made.append((tuple(shape), dtype, src, tag))
        return torch.zeros(tuple(shape), dtype=dtype)


@settings(max_examples=6, deadline=None)
@given(name=st.sampled_from(["mlp-tiny", "gpt2"]),
       cuts=st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3),
       microbatches=st.sampled_from([1, 2]))
def test_receives_lists_every_receive_a_schedule_makes_in_order(name, cuts, microbatches):
    """What ``begin_step`` posts is exactly what the actions then receive: for each of two
    devices hosting alternate units of a cut model, the receives its forward-then-backward
    schedule makes (recorded) equal ``UnitRunner.receives`` of that schedule."""
    batch = 4
    w, inputs, target, part = _cut(name, cuts, batch)
    order = sorted(part.units, key=lambda u: int(u[1:]))
    placements = {u: Placement((f"d{int(u[1:]) % 2}",), (1.0,)) for u in order}
    total = 0
    for device in ("d0", "d1"):
        comm = _RecordingComm()
        runner = UnitRunner(part, placements, device=device, rank_of={"d0": 0, "d1": 1},
                            microbatches=microbatches, batch_size=batch, comm=comm,
                            loss_fn=w.loss)
        mine = [u for u in order if placements[u].devices == (device,)]
        actions = ([("F", u, mb) for mb in range(microbatches) for u in mine]
                   + [("B", u, mb) for mb in range(microbatches) for u in reversed(mine)])
        runner.begin_step(inputs, target)
        for phase, uid, mb in actions:
            (runner.forward if phase == "F" else runner.backward)(uid, mb)
        runner.end_step()
        assert list(runner.receives(actions)) == comm.made
        total += len(comm.made)
    assert total > 0 or len(order) == 1


class _PostingComm(_RecordingComm):
    """A ``_RecordingComm`` that records each ``post`` and posts nothing."""

    def __init__(self):
        super().__init__()
        self.posted: list[tuple] = []

    def post(self, shape, dtype, src, tag):
        self.posted.append((tuple(shape), dtype, src, tag))


def test_every_step_posts_the_receives_of_its_own_schedule():
    """Steps that begin the same schedule post the same receives, and a step that begins
    another schedule posts that one's (the receives are worked out once per schedule):
    device d1 of alternate units over two microbatches, then over its first microbatch's
    actions alone."""
    batch = 4
    w, inputs, target, part = _cut("mlp-tiny", [0.3, 0.6], batch)
    order = sorted(part.units, key=lambda u: int(u[1:]))
    placements = {u: Placement((f"d{int(u[1:]) % 2}",), (1.0,)) for u in order}
    comm = _PostingComm()
    runner = UnitRunner(part, placements, device="d1", rank_of={"d0": 0, "d1": 1},
                        microbatches=2, batch_size=batch, comm=comm, loss_fn=w.loss)
    mine = [u for u in order if placements[u].devices == ("d1",)]
    both = ([("F", u, mb) for mb in range(2) for u in mine]
            + [("B", u, mb) for mb in range(2) for u in reversed(mine)])
    first = [a for a in both if a[2] == 0]
    posted = []
    for actions in (both, both, first, both):
        comm.posted = []
        runner.begin_step(inputs, target, actions)
        posted.append(comm.posted)
    want_both, want_first = list(runner.receives(both)), list(runner.receives(first))
    assert want_both and len(want_first) < len(want_both)
    assert posted == [want_both, want_both, want_first, want_both]
