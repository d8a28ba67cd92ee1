"""The tensor checksum update (``rewrite_checksum_rows``) against the per-packet one
(``rewrite_checksums``, RFC 1624 eqn. 3 with folds), packet by packet: random headers and
checksums, unchanged headers over every checksum value, UDP without a checksum, and the
sums whose fold is 0 (the 0 vs 0xFFFF case the modular form cannot tell apart alone); on
tensors and on numpy arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dl_nfv.nfv.chains.packets import NO_CSUM, rewrite_checksum_rows, rewrite_checksums

FIELDS = ("src", "dst", "sport", "dport")


def _headers(n: int, seed: int):
    rng = np.random.default_rng(seed)
    widths = (1 << 32, 1 << 32, 1 << 16, 1 << 16)
    old = np.stack([rng.integers(0, w, n, dtype=np.int64) for w in widths])
    new = np.stack([rng.integers(0, w, n, dtype=np.int64) for w in widths])
    csums = rng.integers(0, 1 << 16, (2, n), dtype=np.int64)
    proto = np.where(rng.integers(0, 2, n) == 1, 17, 6).astype(np.int64)
    return old, new, csums, proto


def _cases():
    old, new, csums, proto = _headers(4000, 7)
    csums[1, :200], proto[:200] = NO_CSUM, 17  # UDP sent without a checksum
    # a zero sum before the fold: all-ones addresses and ports rewritten to zeros
    old[:, 200:210] = np.array([[0xFFFFFFFF], [0xFFFFFFFF], [0xFFFF], [0xFFFF]])
    new[:, 200:210] = 0
    csums[:, 200:210] = 0xFFFF
    # headers left as they were, over every checksum value
    every = np.arange(1 << 16, dtype=np.int64)
    same = _headers(every.shape[0], 8)
    same[1][:] = same[0]
    same[2][0], same[2][1] = every, every[::-1]
    return [np.concatenate([a, b], axis=-1) for a, b in zip((old, new, csums, proto), same)]


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_rows_equal_the_per_packet_update(kind):
    old, new, csums, proto = _cases()
    if kind == "torch":
        got = rewrite_checksum_rows(*(torch.from_numpy(a) for a in (old, new, csums, proto)))
        got = got.numpy()
    else:
        got = rewrite_checksum_rows(old, new, csums, proto)
        assert isinstance(got, np.ndarray)
    for i in range(old.shape[1]):
        want = rewrite_checksums(dict(zip(FIELDS, old[:, i].tolist())),
                                 dict(zip(FIELDS, new[:, i].tolist())), int(csums[0, i]),
                                 int(csums[1, i]), int(proto[i]))
        assert (int(got[0, i]), int(got[1, i])) == want, i
    # the zero-sum packets exercise the recomputation: both checksums are 0xFFFF
    assert (got[:, 200:210] == 0xFFFF).all()


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_rows_of_parts_equal_the_whole(kind):
    """Parts of the cases without one rare case or another (no UDP without a checksum, no
    zero sum, nothing at all) give what the whole, checked packet by packet above, gives."""
    cases = _cases()
    if kind == "torch":
        cases = [torch.from_numpy(a) for a in cases]
    whole = rewrite_checksum_rows(*cases)
    for lo, hi in ((0, 0), (0, 200), (210, 4000), (300, 20_000), (4000, 4000 + (1 << 16))):
        part = rewrite_checksum_rows(*(a[..., lo:hi] for a in cases))
        assert tuple(part.shape) == (2, hi - lo)
        assert (part == whole[:, lo:hi]).all()
