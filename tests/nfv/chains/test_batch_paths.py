"""The paths the tensor chain takes only in some batches — forced on small ones where they
are the large batches' (one sort by flow hash, the ACL matched per flow, the fixed-point
scan), and the firewall's joint scan with the NAT and its fallback: each equals the
reference."""

from __future__ import annotations

import pytest
import torch

from dl_nfv.artifacts import from_data, load
from dl_nfv.artifacts.nfconfig import NfConfig
from dl_nfv.nfv.chains import engine, kernels, meters, ops, scan
from dl_nfv.nfv.chains import joint as jointscan
from dl_nfv.nfv.chains.packets import load_packets
from dl_nfv.nfv.chains.synth import synthetic_packets

from ..helpers import EXAMPLES, REAL_TRACE
from .test_equivalence import run_both, small_chain


@pytest.fixture
def large_batch_paths(monkeypatch):
    monkeypatch.setattr(engine, "ONE_SORT_FROM", 0)
    monkeypatch.setattr(kernels, "PACKETS_PER_FLOW", 0)
    monkeypatch.setattr(scan, "ROUND_STEPS_PER_PASS", 0)


def test_real_trace_on_large_batch_paths(large_batch_paths):
    packets = load_packets(REAL_TRACE).packets
    run_both(load(EXAMPLES / "fw-nat-lb.yaml").l4_chain, packets, [64, 3])
    run_both(small_chain().l4_chain, packets, [16, 5])
    nat_first = small_chain().l4_chain  # the firewall sees rewritten headers
    run_both([nat_first[1], nat_first[0], *nat_first[2:]], packets, [16])


def test_real_trace_with_numpy_block_moves(monkeypatch):
    """The CPU's numpy forms of the block gathers and the table's row write-back, which the
    engine takes from ``ops.NUMPY_FROM`` elements on (large batches, many flows), forced on
    every size: the tensor engine still equals the reference."""
    monkeypatch.setattr(ops, "NUMPY_FROM", 0)
    packets = load_packets(REAL_TRACE).packets
    run_both(load(EXAMPLES / "fw-nat-lb.yaml").l4_chain, packets, [64, 7])
    run_both(small_chain().l4_chain, packets, [32])


@pytest.mark.parametrize("host", [False, True], ids=["torch", "numpy"])
def test_flow_order_with_colliding_hashes(large_batch_paths, host):
    """Over tensors and over numpy arrays (the CPU's form)."""
    k1 = torch.tensor([5, 7, 5, 9, 7, 5, 9])
    k2 = torch.tensor([1, 1, 1, 2, 1, 3, 2])
    distinct = (k1 * 131 + k2) & 0xFFFF
    cases = (distinct, torch.zeros_like(k1), k1 & 1)
    if host:
        k1, k2, cases = k1.numpy(), k2.numpy(), [h.numpy() for h in cases]
    for hashes in cases:
        order, _, a, b = engine._flow_order(k1, k2, hashes)
        assert a.tolist() == k1[order].tolist() and b.tolist() == k2[order].tolist()
        order = order.tolist()
        keys = [(int(k1[i]), int(k2[i])) for i in order]
        # every flow contiguous, each in arrival order
        runs = [keys[0]] + [b for a, b in zip(keys, keys[1:]) if a != b]
        assert len(runs) == len(set(runs)) == 4
        for key in set(keys):
            rows = [i for i in order if (int(k1[i]), int(k2[i])) == key]
            assert rows == sorted(rows)


@pytest.mark.parametrize("timeout_s, swept", [(10.0, False), (0.03, True)])
def test_sweeps_skipped_only_where_no_flow_can_expire(monkeypatch, timeout_s, swept):
    """A 1 s trace with a sweep due every 50 ms: with time-outs of 10 s no sweep gathers the
    table (every kept flow was seen within the shortest time-out), with 30 ms sweeps run;
    both equal the reference, which sweeps at every due boundary."""
    gathers = []
    live = kernels._Stateful._live
    monkeypatch.setattr(kernels._Stateful, "_live", lambda nf: gathers.append(1) or live(nf))
    timeouts = {name: timeout_s for name in
                ("syn_s", "established_s", "fin_s", "closing_s", "udp_s")}
    chain = [{"nf": "firewall", "default": "allow", "timeouts": timeouts},
             {"nf": "nat", "pool": ["192.0.2.1"], "ports": "5000-5999", "timeouts": timeouts},
             {"nf": "lb", "backends": ["10.9.0.1:8080", "10.9.0.2"], "table_size": 13,
              "timeouts": timeouts},
             {"nf": "monitor", "timeouts": timeouts}]
    specs = from_data(NfConfig, {"kind": "nf-config", "schema_version": 1, "name": "t",
                                 "l4_chain": chain}).l4_chain
    packets = synthetic_packets(flows=40, packets=2400, seed=4, duration_s=1.0, gap_us=2000)
    ref, _ = run_both(specs, packets, [200])
    assert bool(gathers) == swept
    assert (ref.nfs[-1].exported > 0) == swept  # the monitor exported idle flows


@pytest.mark.parametrize("timeout_s, joint", [(10.0, True), (0.03, False)])
def test_joint_scan_only_where_no_time_out_can_fall(monkeypatch, timeout_s, joint):
    """The firewall and the NAT scan as one product machine in every batch where no packet
    can find a time-out (time-outs of 10 s on a 1 s trace), and each scans its own where
    one can (30 ms: a batch spans more); both equal the reference, packet for packet and
    state for state."""
    taken = []
    run = jointscan.JointScan.run

    def counted(self, *args):
        got = run(self, *args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(jointscan.JointScan, "run", counted)
    timeouts = {name: timeout_s for name in
                ("syn_s", "established_s", "fin_s", "closing_s", "udp_s")}
    chain = [{"nf": "firewall", "default": "allow", "timeouts": timeouts},
             {"nf": "nat", "pool": ["192.0.2.1"], "ports": "5000-5999", "timeouts": timeouts},
             {"nf": "lb", "backends": ["10.9.0.1:8080", "10.9.0.2"], "table_size": 13,
              "timeouts": timeouts},
             {"nf": "monitor", "timeouts": timeouts}]
    specs = from_data(NfConfig, {"kind": "nf-config", "schema_version": 1, "name": "t",
                                 "l4_chain": chain}).l4_chain
    packets = synthetic_packets(flows=40, packets=2400, seed=4, duration_s=1.0, gap_us=2000)
    run_both(specs, packets, [200])
    assert len(taken) == 12 and set(taken) == {joint}


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "torch"])
@pytest.mark.parametrize("ports", ["5000-5999", "5000-5003"])  # pool: ample, four bindings
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (0, 3, 1, 2), (1, 0, 2, 3)])
def test_dropped_packets_masked_or_compacted(monkeypatch, order, ports, host):
    """Packets an NF drops stay in the batch, masked, for the NFs after it that can take them
    (a session NF scanned with the firewall or sharing the scan of the NF before, the
    monitor) and are compacted out before any other (a NAT after the monitor scans its own;
    an LB after a NAT that dropped for want of bindings): with an ACL that denies half the
    clients and time-outs no batch reaches, each order equals the reference, packet for
    packet and state for state, and the masked path is taken where the firewall comes first.
    Also with the CPU's numpy steps off (the torch forms CUDA runs)."""
    monkeypatch.setattr(ops, "HOST", host)
    masked = []
    for cls in (kernels._SessionKernel, meters.MonitorKernel):
        def counted(self, sub, process=cls.process):
            masked.append(sub.live is not None)
            return process(self, sub)

        monkeypatch.setattr(cls, "process", counted)
    timeouts = {name: 10.0 for name in
                ("syn_s", "established_s", "fin_s", "closing_s", "udp_s")}
    chain = [{"nf": "firewall", "default": "allow", "timeouts": timeouts,
              "acl": [{"action": "deny", "proto": "tcp", "src": "10.0.0.0/13"}]},
             {"nf": "nat", "pool": ["192.0.2.1"], "ports": ports, "timeouts": timeouts},
             {"nf": "lb", "backends": ["10.9.0.1:8080", "10.9.0.2"], "table_size": 13,
              "timeouts": timeouts},
             {"nf": "monitor", "timeouts": timeouts}]
    specs = from_data(NfConfig, {"kind": "nf-config", "schema_version": 1, "name": "t",
                                 "l4_chain": [chain[k] for k in order]}).l4_chain
    packets = synthetic_packets(flows=40, packets=2400, seed=4, duration_s=1.0, gap_us=2000)
    run_both(specs, packets, [200, 37])
    assert any(masked) == (order[0] == 0)


def test_real_trace_torch_forms_on_a_cpu(monkeypatch):
    """With the CPU's numpy steps off (``ops.HOST``), the torch forms CUDA runs (keys and
    flow sort, table probes, per-flow ACL, scan, NAT starts, spreads, checksums) equal the
    reference too."""
    monkeypatch.setattr(ops, "HOST", False)
    packets = load_packets(REAL_TRACE).packets
    run_both(load(EXAMPLES / "fw-nat-lb.yaml").l4_chain, packets, [64, 7])
    run_both(small_chain().l4_chain, packets, [32, 5])
