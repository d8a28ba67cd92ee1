"""The firewall kernel's ACL, every rule at once, equals the reference's first match."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dl_nfv.artifacts import from_data
from dl_nfv.artifacts.nfconfig import NfConfig
from dl_nfv.nfv.chains.engine import build_chain
from dl_nfv.nfv.chains.reference import Pkt, acl_allows


def _firewall(rules, default):
    config = from_data(NfConfig, {"kind": "nf-config", "schema_version": 1, "name": "acl",
                                  "l4_chain": [{"nf": "firewall", "default": default,
                                                "acl": rules}]})
    return build_chain(config.l4_chain, "tensor").nfs[0]


RULES = [
    {"action": "allow", "proto": "tcp", "src": "10.0.0.0/30", "dst_port": "80"},
    {"action": "deny", "src": "10.0.0.0/29"},
    {"action": "allow", "proto": "udp", "dst": "10.0.1.0/31", "src_port": "1-2"},
    {"action": "deny", "proto": "tcp", "dst_port": "79-81"},
    {"action": "deny", "src": "2001:db8::/32"},
    {"action": "allow", "src_port": "3"},
]


@pytest.mark.parametrize("default", ["allow", "deny"])
@pytest.mark.parametrize("count", [0, 1, 3, len(RULES)])
def test_match_is_the_first_matching_rule(default, count):
    nf = _firewall(RULES[:count], default)
    rng = np.random.default_rng(count)
    n = 600
    src = (10 << 24) + rng.integers(0, 10, n)
    dst = (10 << 24) + 256 + rng.integers(0, 3, n)
    sport, dport = rng.integers(0, 5, n), rng.integers(77, 83, n)
    proto = rng.choice([6, 17], n)
    got = nf._match(*(torch.from_numpy(x) for x in (src, dst, sport, dport, proto)))
    want = [int(acl_allows(nf.rules, nf.default_allow, Pkt(0, *map(int, f), 0, 0, (0, 0), 0)))
            for f in zip(src, dst, sport, dport, proto)]
    assert got.tolist() == want
    # the numpy form (a CPU's per-flow match)
    assert nf._match(src, dst, sport, dport, proto).tolist() == want
