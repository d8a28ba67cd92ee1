"""Plans the simulator must refuse, each with one clear message."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import (
    ArtifactMismatch,
    BadInput,
    Compression,
    Fusion,
    Group,
    Pipeline,
    SyncMethod,
)
from dl_nfv.simulator import simulate

from .helpers import chain, graph, mesh, one_group, op, plan


def test_op_absent_from_the_graph():
    g, t = chain(2), mesh(1)
    p = plan(g, t, [Group(id="a", ops=("op0", "op1", "ghost"), devices=t.device_names)])
    with pytest.raises(ArtifactMismatch, match="'ghost'"):
        simulate(p, g, t)


def test_device_absent_from_the_topology():
    g, t = chain(2), mesh(1)
    p = plan(g, t, [one_group(g, ["m/gpu7"])])
    with pytest.raises(ArtifactMismatch, match="'m/gpu7'"):
        simulate(p, g, t)


def test_fingerprint_mismatch():
    g, t = chain(2), mesh(2)
    p = plan(g, t, [one_group(g, t.device_names)])
    other = chain(2, fwd_ms=5.0)
    with pytest.raises(ArtifactMismatch, match="sha256"):
        simulate(p, other, t)
    simulate(p, other, t, check_fingerprints=False)  # planners simulate drafts of their own


def test_cyclic_order_on_one_device():
    g, t = chain(3), mesh(1)
    d = t.device_names[0]
    p = plan(g, t, [one_group(g, [d])], order={d: ("op2", "op1", "op0")})
    with pytest.raises(BadInput, match="cyclic.*forward op"):
        simulate(p, g, t)


def test_cyclic_order_across_devices():
    # a (dev0) -> b (dev1) -> c (dev0); dev0 insists on c before a
    g = graph([op("a", param_bytes=4), op("b"), op("c")], [("a", "b", 8), ("b", "c", 8)])
    t = mesh(2)
    d0, d1 = t.device_names
    p = plan(g, t, [Group(id="x", ops=("a", "c"), devices=(d0,)),
                    Group(id="y", ops=("b",), devices=(d1,))], order={d0: ("c", "a")})
    with pytest.raises(BadInput, match="cyclic"):
        simulate(p, g, t)


def test_deadlocking_pipeline_schedule():
    g, t = chain(2), mesh(2)
    d0, d1 = t.device_names
    groups = [Group(id="s0", ops=("op0",), devices=(d0,)), Group(id="s1", ops=("op1",), devices=(d1,))]
    sched = {d0: "0F0 0B0 0F1 0B1", d1: "1F0 1F1 1B0 1B1"}
    p = plan(g, t, groups, pipeline=Pipeline(microbatches=2, stages=("s0", "s1"), schedule=sched))
    with pytest.raises(BadInput, match="pipeline schedule is cyclic"):
        simulate(p, g, t)


def test_partial_order_is_refused():
    g, t = chain(3), mesh(1)
    d = t.device_names[0]
    p = plan(g, t, [one_group(g, [d])], order={d: ("op0", "op1")})
    with pytest.raises(BadInput, match="lists 2 of the 3 ops.*'op2'"):
        simulate(p, g, t)


def test_group_outside_the_pipeline_is_refused():
    g, t = chain(2), mesh(2)
    d0, d1 = t.device_names
    groups = [Group(id="s0", ops=("op0",), devices=(d0,)), Group(id="x", ops=("op1",), devices=(d1,))]
    p = plan(g, t, groups, pipeline=Pipeline(microbatches=1, stages=("s0",),
                                             schedule={d0: "0F0 0B0"}))
    with pytest.raises(BadInput, match="group 'x' is not a pipeline stage"):
        simulate(p, g, t)


def test_fusion_across_groups_and_fusion_cycles_are_refused():
    g, t = chain(3), mesh(2)
    d0, d1 = t.device_names
    split = [Group(id="a", ops=("op0", "op1"), devices=(d0,)), Group(id="b", ops=("op2",), devices=(d1,))]
    with pytest.raises(BadInput, match="fuses ops of groups"):
        simulate(plan(g, t, split, fusion=Fusion(op_groups=(("op1", "op2"),))), g, t)
    whole = [one_group(g, [d0])]
    with pytest.raises(BadInput, match="forms a cycle"):
        simulate(plan(g, t, whole, fusion=Fusion(op_groups=(("op0", "op2"),))), g, t)


def test_buckets_across_groups_are_refused():
    g, t = chain(2), mesh(2)
    d0, d1 = t.device_names
    groups = [Group(id="a", ops=("op0",), devices=(d0,)), Group(id="b", ops=("op1",), devices=(d1,))]
    with pytest.raises(BadInput, match="mixes ops of groups"):
        simulate(plan(g, t, groups, fusion=Fusion(gradient_buckets=(("op0", "op1"),))), g, t)


def test_sfb_with_a_parameter_server_is_refused():
    g, t = chain(2), mesh(2)
    group = one_group(g, t.device_names, sync=SyncMethod.PS, ps_servers=(t.device_names[0],))
    group = dataclasses.replace(group, compression=Compression.SFB)
    with pytest.raises(BadInput, match="'sfb' is modelled with sync 'allreduce' only"):
        simulate(plan(g, t, [group]), g, t)
