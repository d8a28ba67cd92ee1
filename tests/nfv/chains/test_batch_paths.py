"""The paths the tensor chain takes only in large batches, forced on small ones: one sort
by flow hash, the ACL matched per flow, the fixed-point scan; each equals the reference."""

from __future__ import annotations

import pytest
import torch

from dl_nfv.artifacts import load
from dl_nfv.nfv.chains import engine, kernels, scan
from dl_nfv.nfv.chains.packets import load_packets

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


def test_flow_order_with_colliding_hashes(large_batch_paths):
    k1 = torch.tensor([5, 7, 5, 9, 7, 5, 9])
    k2 = torch.tensor([1, 1, 1, 2, 1, 3, 2])
    distinct = (k1 * 131 + k2) & 0xFFFF
    for hashes in (distinct, torch.zeros_like(k1), k1 & 1):
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
