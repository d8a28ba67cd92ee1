"""The IDS's literal matchers report every occurrence ending after the tail, as brute force does.

Both back ends (Hyperscan when it loads, ahocorasick-rs otherwise) are checked
against an enumeration with ``bytes.find`` on seeded haystacks over a small
alphabet, where patterns overlap, nest and repeat.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dl_nfv.nfv.nfs import ids


def _brute(patterns: list[bytes], hay: bytes, skip: int) -> Counter:
    found = Counter()
    for pid, p in enumerate(patterns):
        at = hay.find(p)
        while at >= 0:
            if at + len(p) > skip:
                found[pid] += 1
            at = hay.find(p, at + 1)
    return found


@pytest.mark.parametrize("backend", ["hyperscan", "ahocorasick"])
def test_every_occurrence_after_the_tail(monkeypatch, backend):
    if backend == "hyperscan" and ids.hyperscan is None:
        pytest.skip("hyperscan does not load here")
    if backend == "ahocorasick":
        monkeypatch.setattr(ids, "hyperscan", None)
    rng = random.Random(7)
    patterns = [b"ab", b"aba", b"bab", b"a", b"abab", b"\x00\xff", b"ba" * 3]
    side = ids._Side(patterns, 0, False)
    assert (side.hs is not None) == (backend == "hyperscan")
    for _ in range(300):
        hay = bytes(rng.choice(b"ab\x00\xff") for _ in range(rng.randrange(0, 60)))
        skip = rng.randrange(0, len(hay) + 1)
        assert Counter(side.ending_after(hay, skip)) == _brute(patterns, hay, skip)
