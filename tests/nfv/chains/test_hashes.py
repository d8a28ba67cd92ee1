"""The LB's flow hash (``packets.flow_hash``) in its three forms — Python ints (the reference
engine's), int64 tensors and int64 numpy arrays (the CPU's, over uint32 words) — against a
plain per-key transcription of the mix, over keys of random endpoints (addresses above
2^31 make the key's first word negative) and the words' extreme values."""

from __future__ import annotations

import numpy as np
import torch

from dl_nfv.nfv.chains.packets import flow_hash, key_pair


def _mix(x: int) -> int:
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) % (1 << 32)
    return (x >> 16) ^ x


def _plain(k1: int, k2: int) -> int:
    """The hash of the key's four 32-bit words, high word of ``k1`` first, by modular sums."""
    w1, w2 = k1 % (1 << 64), k2 % (1 << 64)
    h = _mix(w1 >> 32)
    h = _mix(h ^ (w1 & 0xFFFFFFFF))
    h = _mix(h ^ (w2 & 0xFFFFFFFF))
    return _mix(h ^ (w2 >> 32))


def test_flow_hash_forms_equal_the_plain_mix():
    rng = np.random.default_rng(11)
    n = 2000
    src, dst = rng.integers(0, 1 << 32, n), rng.integers(0, 1 << 32, n)
    sport, dport = rng.integers(0, 1 << 16, n), rng.integers(0, 1 << 16, n)
    proto = np.where(rng.integers(0, 2, n) == 1, 17, 6)
    k1, k2, _ = key_pair(src, sport, dst, dport, proto)
    edges = np.array([[-(1 << 63), 0], [-1, (1 << 40) - 1], [(1 << 63) - 1, 6], [0, 0]])
    k1, k2 = np.concatenate([k1, edges[:, 0]]), np.concatenate([k2, edges[:, 1]])
    assert (k1 < 0).any()
    want = [_plain(a, b) for a, b in zip(k1.tolist(), k2.tolist())]
    assert [flow_hash(a, b) for a, b in zip(k1.tolist(), k2.tolist())] == want
    got = flow_hash(k1, k2)
    assert got.dtype == np.int64 and got.tolist() == want
    assert flow_hash(torch.from_numpy(k1), torch.from_numpy(k2)).tolist() == want
