"""The cost model against closed forms computed independently here."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dl_nfv.artifacts import Collective, OpKind, Optimizer, cluster_of
from dl_nfv.artifacts.devices import CATALOG
from dl_nfv.simulator import CostModel, Flow

from .helpers import GPU, chain, graph, mesh, op, star


def bytes_per_ms(gbps: float) -> float:
    return gbps * 1e9 / 8 / 1e3


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [1e3, 4e6, 1e9])
def test_ring_allreduce_closed_form(n, nbytes):
    bw, alpha_us = 100.0, 3.0
    cm = CostModel(chain(1), mesh(n, bandwidth_gbps=bw, latency_us=alpha_us))
    devices = cm.cluster.device_names
    expected = 2 * (n - 1) / n * nbytes / bytes_per_ms(bw) + 2 * (n - 1) * alpha_us / 1e3
    got = cm.allreduce_ms(devices, nbytes, Collective.RING)
    assert got == pytest.approx(expected, rel=1e-9)
    assert cm.allreduce_ms(devices, nbytes) <= got + 1e-12  # AUTO is never slower


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_allreduce_ms_per_byte_is_the_cheapest_algorithm_s_slope(n):
    """On uniform links the ring's bandwidth term, 2 (n - 1) / n bytes per byte, is the least
    of the three; every size costs at least that much per byte (latencies only add)."""
    bw = 100.0
    cm = CostModel(chain(1), mesh(n, bandwidth_gbps=bw, latency_us=3.0))
    devices = cm.cluster.device_names
    slope = cm.allreduce_ms_per_byte(devices)
    assert slope == pytest.approx(2 * (n - 1) / n / bytes_per_ms(bw), rel=1e-12)
    for nbytes in (1.0, 1e6, 1e12):
        assert cm.allreduce_ms(devices, nbytes) >= nbytes * slope * (1 - 1e-12)
    assert cm.allreduce_ms_per_byte(devices[:1]) == 0.0


def test_tree_allreduce_closed_form():
    # 4 devices, binary tree: 2 levels, each pays latency; payload crosses each edge up and down
    bw, alpha_us, nbytes = 50.0, 2.0, 8e6
    cm = CostModel(chain(1), mesh(4, bandwidth_gbps=bw, latency_us=alpha_us))
    expected = 2 * (2 * alpha_us / 1e3 + nbytes / bytes_per_ms(bw))
    assert cm.allreduce_ms(cm.cluster.device_names, nbytes, Collective.TREE) == \
        pytest.approx(expected, rel=1e-9)


def test_allgather_and_broadcast_closed_forms():
    bw, alpha_us, s = 80.0, 1.0, 2e6
    cm = CostModel(chain(1), mesh(5, bandwidth_gbps=bw, latency_us=alpha_us))
    devs = cm.cluster.device_names
    assert cm.allgather_ms(devs, s) == pytest.approx(4 * (alpha_us / 1e3 + s / bytes_per_ms(bw)))
    # 5 devices: ceil(log2 5) = 3 levels, each a latency; the payload once per edge, concurrently
    assert cm.broadcast_ms(devs[0], devs, s) == pytest.approx(3 * alpha_us / 1e3 + s / bytes_per_ms(bw))


def test_ps_is_bounded_by_the_server_nic():
    workers, nic, s = 4, 10.0, 5e6
    cm = CostModel(chain(1), star(workers + 1, nic_gbps=nic))
    names = cm.cluster.device_names
    server, ws = names[-1], names[:-1]
    route = cm.cluster.route(ws[0], server)
    # every worker's full gradient enters the server NIC, then leaves it
    one_way = route.latency_us / 1e3 + workers * s / bytes_per_ms(nic)
    push, pull = cm.ps_phases_ms(ws, [server], s)
    assert push == pytest.approx(one_way) and pull == pytest.approx(one_way)
    assert cm.ps_ms(ws, [server], s) == pytest.approx(2 * one_way)
    # two servers among two workers: each worker's NIC sends its other-server half out, each
    # server's NIC takes the other worker's half in: s/2 bytes per NIC direction
    push2, _ = cm.ps_phases_ms(ws[:2], ws[:2], s)
    assert push2 == pytest.approx(route.latency_us / 1e3 + (s / 2) / bytes_per_ms(nic))


def test_transfer_is_latency_plus_bytes_over_bottleneck():
    cm = CostModel(chain(1), star(2, nic_gbps=10.0, nic_latency_us=5.0))
    a, b = cm.cluster.device_names
    route = cm.cluster.route(a, b)
    # device -> host (PCIe 126 Gbps, 1 us), host -> switch, switch -> host, host -> device
    assert route.latency_us == pytest.approx(1 + 5 + 5 + 1)
    assert route.bandwidth_gbps == 10.0
    assert cm.transfer_ms(a, b, 1e6) == pytest.approx(12e-3 + 1e6 / bytes_per_ms(10.0))
    assert cm.transfer_ms(a, a, 1e6) == 0.0
    assert cm.concurrent_ms([Flow(a, b, 1e6), Flow(b, a, 1e6)]) == pytest.approx(
        cm.transfer_ms(a, b, 1e6))  # full duplex: opposite directions do not share


def test_collective_cache_gives_the_same_answers_in_any_call_order():
    t = mesh(6, bandwidth_gbps=40.0)
    names = cluster_of(t).device_names
    a, b = CostModel(chain(1), t), CostModel(chain(1), t)
    sizes = [1e2, 3e5, 7e7]
    forward = [a.allreduce_ms(names[:k], s, alg) for k in (2, 4, 6) for s in sizes
               for alg in Collective]
    backward = [b.allreduce_ms(names[:k], s, alg) for k in (6, 4, 2) for s in reversed(sizes)
                for alg in reversed(list(Collective))]
    assert sorted(forward) == pytest.approx(sorted(backward), rel=1e-12)


def test_collective_link_bytes_of_a_ring():
    n, s = 4, 1e6
    cm = CostModel(chain(1), mesh(n))
    loads = cm.collective_link_bytes("allreduce", cm.cluster.device_names, s,
                                     algorithm=Collective.RING)
    ring = cm.ring_order(cm.cluster.device_names)
    for a, b in zip(ring, ring[1:] + ring[:1]):
        assert loads[(a, b)] == pytest.approx(2 * (n - 1) / n * s)
    assert len(loads) == n


def test_op_time_scales_with_the_batch_but_not_the_launch():
    g = graph([op("a", fwd_ms=1.0, bwd_ms=3.0)])
    cm = CostModel(g, mesh(1))
    device = cm.cluster.device_names[0]
    launch = CATALOG[GPU].launch_overhead_us / 1e3
    assert cm.op_ms("a", device) == 1.0
    assert cm.op_ms("a", device, "bwd", 0.25) == pytest.approx(launch + (3.0 - launch) * 0.25)
    assert cm.ops_ms(["a"], device, 0.5) == pytest.approx(
        (launch + (1 - launch) / 2, launch + (3 - launch) / 2))


def test_fused_ops_save_launches_and_internal_round_trips():
    g = graph([op("a", 1.0, 1.0, output_bytes=1000), op("b", 1.0, 1.0)], [("a", "b", 9_000_000)])
    cm = CostModel(g, mesh(1))
    device = cm.cluster.device_names[0]
    t = CATALOG[GPU]
    saved = t.launch_overhead_us / 1e3 + 2 * 9e6 / (t.memory_bandwidth_gb_per_s * 1e6)
    assert cm.fused_ms(["a", "b"], device) == pytest.approx(2.0 - saved)


def test_update_is_memory_bound():
    cm = CostModel(chain(1), mesh(1))
    device = cm.cluster.device_names[0]
    t = CATALOG[GPU]
    p = 1e9
    bw = t.memory_bandwidth_gb_per_s * 1e6  # bytes per ms
    # Adam's fused step (as the runtime runs it): reads the parameters, gradients and both
    # averages, writes the parameters and both averages: 7 bytes per parameter byte
    expected = t.launch_overhead_us / 1e3 + p * 7 / bw
    assert cm.update_ms(p, device, Optimizer.ADAM) == pytest.approx(expected)
    # SGD with momentum, fused: reads parameters, gradients, buffer, writes two: 5
    assert cm.update_ms(p, device) == pytest.approx(t.launch_overhead_us / 1e3 + p * 5 / bw)
    # gradient buckets: zeroed once (a write costs two passes), added into by each of 4
    # microbatches (read two, write one)
    assert cm.upkeep_ms(p, device, accumulations=4) == pytest.approx(p * (2 + 3 * 4) / bw)


def test_measured_fixed_part_does_not_scale_with_the_batch():
    g = graph([op("a", 10.0, 20.0)], [])
    a = g.ops[0]
    fixed = dataclasses.replace(a, fwd_fixed_ms={GPU: 4.0}, bwd_fixed_ms={GPU: 2.0})
    cm = CostModel(dataclasses.replace(g, ops=(fixed,)), mesh(1))
    device = cm.cluster.device_names[0]
    assert cm.op_ms("a", device, "fwd", 0.25) == pytest.approx(4.0 + 6.0 * 0.25)
    assert cm.op_ms("a", device, "bwd", 0.5) == pytest.approx(2.0 + 18.0 * 0.5)
    assert cm.ops_ms(["a"], device, 0.25) == pytest.approx((5.5, 6.5))
    # without a measured part, only the launch overhead stays fixed
    plain = CostModel(g, mesh(1))
    launch = CATALOG[GPU].launch_overhead_us / 1e3
    assert plain.op_ms("a", device, "fwd", 0.25) == pytest.approx(launch + (10 - launch) * 0.25)


def _tied_pair(tie_sum_ms: dict[str, float], device_type: str = "cpu"):
    """emb (owner of a 64 MB weight, measured on ``device_type``) and head, which uses it."""
    nbytes = 64 * 2**20
    emb = dataclasses.replace(op("emb", 10.0, 100.0, param_bytes=nbytes, device_type=device_type),
                              params=("w",), flops=1e9, bwd_flops=2e9, bytes_accessed=1e8,
                              tie_sum_ms=tie_sum_ms)
    head = dataclasses.replace(op("head", 5.0, 8.0, device_type=device_type),
                               shared_params={"w": nbytes})
    return graph([emb, head], [("emb", "head", 0)]), nbytes


def test_a_measured_tie_sum_is_memory_bound_work_apart_from_the_owner_s_backward():
    tied, _ = _tied_pair({"cpu": 40.0})
    untied = dataclasses.replace(tied, ops=(dataclasses.replace(
        tied.ops[0], bwd_ms={"cpu": 60.0}, tie_sum_ms={}), tied.ops[1]))
    cpu, gpu = CATALOG["cpu"], CATALOG[GPU]
    on_cpu = CostModel(tied, mesh(1, device_type="cpu"))
    assert on_cpu.tie_sum_ms("emb", on_cpu.cluster.device_names[0]) == 40.0
    assert on_cpu.tie_sum_ms("head", on_cpu.cluster.device_names[0]) == 0.0
    # on an unmeasured type: the sum scaled by memory bandwidth, on top of the rest of the
    # backward, calibrated on the measurement without the sum
    a = CostModel(tied, mesh(1), reference="cpu")
    b = CostModel(untied, mesh(1), reference="cpu")
    device = a.cluster.device_names[0]
    tie = 40.0 * cpu.memory_bandwidth_gb_per_s / gpu.memory_bandwidth_gb_per_s
    assert a.tie_sum_ms("emb", device) == pytest.approx(tie)
    assert a.op_ms("emb", device, "bwd") == pytest.approx(b.op_ms("emb", device, "bwd") + tie)
    # the sum does not shrink with the batch
    launch = gpu.launch_overhead_us / 1e3
    assert a.op_ms("emb", device, "bwd", 0.25) - a.op_ms("emb", device, "bwd") * 0.25 == \
        pytest.approx((launch + tie) * 0.75)


def test_an_unmeasured_tie_sum_is_three_passes_over_the_weight_and_within_the_fixed_part():
    g, nbytes = _tied_pair({}, device_type=GPU)
    cm = CostModel(g, mesh(1))
    device = cm.cluster.device_names[0]
    launch = CATALOG[GPU].launch_overhead_us / 1e3
    tie = nbytes * 3 / (CATALOG[GPU].memory_bandwidth_gb_per_s * 1e6)
    assert cm.tie_sum_ms("emb", device) == pytest.approx(tie)
    assert cm.bwd_fixed_by_type[0, 0] == pytest.approx(launch + tie)
    # a measured fixed part bounds it
    fixed = dataclasses.replace(g.ops[0], bwd_fixed_ms={GPU: tie / 2})
    capped = CostModel(dataclasses.replace(g, ops=(fixed, g.ops[1])), mesh(1))
    assert capped.tie_sum_ms("emb", device) == pytest.approx(tie / 2)


def test_sufficient_factors_recover_the_layer_shape():
    rows, fin, fout = 64, 300, 500
    g = graph([op("x", output_bytes=rows * fin * 4),
               op("fc", param_bytes=fin * fout * 4, output_bytes=rows * fout * 4,
                  kind=OpKind.MATMUL)], [("x", "fc", rows * fin * 4)])
    cm = CostModel(g, mesh(4))
    r, i, o = cm.sfb_factors("fc")
    assert (r, i, o) == pytest.approx((rows, fin, fout))
    devs = cm.cluster.device_names
    assert cm.sfb_op_ms("fc", devs) == pytest.approx(cm.allgather_ms(devs, rows / 4 * (fin + fout) * 4))
    assert cm.sfb_factors("x") is None


def test_sufficient_factors_take_the_output_from_the_edges_a_profile_records():
    # A profile records in output_bytes what the backward keeps: nothing for a matmul
    # (autograd saves its input). The tensor it passes on is on its outgoing edge.
    rows, fin, fout = 64, 300, 500
    g = graph([op("x", output_bytes=rows * fin * 4),
               op("fc", param_bytes=fin * fout * 4, output_bytes=0, kind=OpKind.MATMUL),
               op("act", output_bytes=rows * fout * 4)],
              [("x", "fc", rows * fin * 4), ("fc", "act", rows * fout * 4)])
    cm = CostModel(g, mesh(4))
    assert cm.sfb_factors("fc") == pytest.approx((rows, fin, fout))
    assert cm.sfb_factor_bytes("fc") == rows * (fin + fout) * 4
    assert math.isclose(cm.sfb_factor_bytes("fc"), rows * (fin + fout) * 4)
