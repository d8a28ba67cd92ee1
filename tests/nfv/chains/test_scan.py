"""The state-machine scan: rounds and fixed point equal a per-packet walk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dl_nfv.nfv.chains import states as st
from dl_nfv.nfv.chains.scan import Segments, fsm_scan, scan_by_rounds, scan_to_fixed_point


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


@pytest.mark.parametrize("machine", ["conn", "session"])
@pytest.mark.parametrize("seed", range(6))
def test_both_methods_equal_a_walk(machine, seed):
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
