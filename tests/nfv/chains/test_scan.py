"""The state-machine scan: rounds and fixed point equal a per-packet walk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dl_nfv.nfv.chains import ops
from dl_nfv.nfv.chains import states as st
from dl_nfv.nfv.chains.scan import (
    Segments,
    fragile_states,
    fsm_scan,
    quiet_rows,
    scan_by_rounds,
    scan_to_fixed_point,
)
from dl_nfv.nfv.traffic.pcap import ACK, TCP, UDP


def walk(nxt, timeouts, cls, gap, flow, s0):
    """Packet by packet, each flow from its ``s0``: (found, after)."""
    cur = dict(enumerate(s0))
    found, after = [], []
    for c, g, f in zip(cls, gap, flow):
        s = cur[f]
        found.append(s)
        s = 0 if g > timeouts[s] else s
        cur[f] = nxt[c][s]
        after.append(cur[f])
    return found, after


@pytest.fixture(params=[True, False], ids=["numpy", "torch"])
def host_scan(request, monkeypatch):
    """``fsm_scan`` in both forms: numpy over the tensors' memory (a CPU's) and torch's."""
    monkeypatch.setattr(ops, "HOST", request.param)


@pytest.mark.parametrize("machine", ["conn", "session"])
@pytest.mark.parametrize("seed", range(6))
def test_both_methods_equal_a_walk(machine, seed, host_scan):
    rng = np.random.default_rng(seed)
    nxt, _, _, width = st.table(machine)
    flows, n = int(rng.integers(1, 20)), int(rng.integers(1, 400))
    flow = np.sort(rng.integers(0, flows, n))  # flow-sorted, arrival within a flow
    present = np.unique(flow)
    flow = np.searchsorted(present, flow)
    timeouts = rng.integers(5, 50, width).tolist()
    cls = rng.integers(0, len(nxt), n).tolist()
    gap = rng.integers(0, 60, n).tolist()
    s0 = rng.integers(0, width, len(present)).tolist()
    want_found, want_after = walk(nxt, timeouts, cls, gap, flow.tolist(), s0)
    k = torch.from_numpy(flow)
    seg = Segments.of(k, torch.zeros_like(k))
    args = (torch.tensor(nxt), torch.tensor(timeouts), torch.tensor(cls), torch.tensor(gap), seg,
            torch.tensor(s0))
    for method in (scan_by_rounds, scan_to_fixed_point):
        found, after = method(*args)
        assert found.tolist() == want_found and after.tolist() == want_after, method.__name__
    found_eff, after, timed_out = fsm_scan(*args)
    lapsed = [f != 0 and g > timeouts[f] for f, g in zip(want_found, gap)]
    assert timed_out.tolist() == lapsed
    assert found_eff.tolist() == [0 if t else f for f, t in zip(want_found, lapsed)]


@pytest.mark.parametrize("machine", ["conn", "session"])
@pytest.mark.parametrize("seed", range(8))
def test_stepping_only_candidates_equals_a_walk(machine, seed, host_scan):
    """Mostly quiet packets (plain ACKs, UDP), a few of every class, long flows, gaps
    that sometimes pass a time-out: the candidates-only scan is the walk."""
    rng = np.random.default_rng(100 + seed)
    nxt, _, _, width = st.table(machine)
    data = [st.packet_class(f, p, a) * 2 + d for f, p in ((ACK, TCP), (0, UDP))
            for a in (0, 1) for d in (0, 1)]
    quiet = quiet_rows(torch.tensor(nxt), data)
    assert bool(quiet[data].all()) and not bool(quiet.all())
    flows, n = int(rng.integers(1, 30)), int(rng.integers(1, 600))
    flow = np.sort(rng.integers(0, flows, n))
    flow = np.searchsorted(np.unique(flow), flow)
    timeouts = [1 << 62] + rng.integers(40, 90, width - 1).tolist()
    some = rng.random(n) < 0.15
    cls = np.where(some, rng.integers(0, len(nxt), n), rng.choice(data, n)).tolist()
    gap = np.where(rng.random(n) < 0.05, 100, rng.integers(0, 30, n)).tolist()
    s0 = rng.integers(0, width, int(flow.max()) + 1).tolist()
    want_found, want_after = walk(nxt, timeouts, cls, gap, flow.tolist(), s0)
    k = torch.from_numpy(flow)
    lapsed = [f != 0 and g > timeouts[f] for f, g in zip(want_found, gap)]
    fragile = fragile_states(torch.tensor(nxt), quiet)
    # the states a quiet row changes, by enumeration
    assert fragile.tolist() == [any(nxt[r][s] != s for r in range(len(nxt)) if quiet[r])
                                for s in range(width)]
    for narrowed in (None, fragile):  # the check of the packets not stepped, narrowed or not
        found_eff, after, timed_out = fsm_scan(
            torch.tensor(nxt), torch.tensor(timeouts), torch.tensor(cls), torch.tensor(gap),
            Segments.of(k, torch.zeros_like(k)), torch.tensor(s0), quiet, narrowed)
        assert after.tolist() == want_after and timed_out.tolist() == lapsed
        assert found_eff.tolist() == [0 if t else f for f, t in zip(want_found, lapsed)]


@pytest.mark.parametrize("seed", range(6))
def test_ends_of_marked_packets(seed, host_scan):
    """Per segment, its first and last marked packets (n and -1 where none), against a walk."""
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(1, 300))
    flow = np.sort(rng.integers(0, int(rng.integers(1, 40)), n))
    flow = np.searchsorted(np.unique(flow), flow)
    mask = rng.random(n) < rng.choice([0.0, 0.1, 0.7, 1.0])
    if seed % 2:  # whole segments marked or not (the reductions' shortcut)
        mask = (rng.random(int(flow.max()) + 1) < 0.6)[flow]
    seg = Segments.of(torch.from_numpy(flow))
    head, tail = seg.ends_of(torch.from_numpy(mask))
    for f in range(int(flow.max()) + 1):
        marked = [i for i in range(n) if flow[i] == f and mask[i]]
        assert int(head[f]) == (marked[0] if marked else n)
        assert int(tail[f]) == (marked[-1] if marked else -1)
