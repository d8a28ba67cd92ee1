"""The heap policy of timing processes: with freed memory kept, a step's repeated large
allocations touch no new pages; with the system policy, each one faults its pages in again."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from dl_nfv.artifacts import BadInput
from dl_nfv.profilers import allocator

PAGES = (64 << 20) // 4096  # pages of one 64 MiB buffer
ROUNDS = 10

SCRIPT = f"""
import resource
import torch
from dl_nfv.profilers.allocator import keep_freed_memory
print(keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):  # 64 MiB, allocated and freed a few times before counting: the heap
    x = torch.ones(16 << 20)  # settles (glibc may place the first blocks anew)
    del x
before = faults()
for _ in range({ROUNDS}):
    x = torch.ones(16 << 20)
    del x
print(faults() - before)
"""

has_mallopt = hasattr(ctypes.CDLL(None), "mallopt")


def _faults(policy: str) -> tuple[str, int]:
    env = {**os.environ, allocator.ENV: policy}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not has_mallopt, reason="the C library has no mallopt (not glibc)")
def test_kept_memory_is_not_faulted_in_again():
    applied, kept = _faults("kept")
    assert applied == "kept"
    # glibc may place the block anew now and then (something small took part of the free
    # block); most rounds touch no new page
    assert kept <= 3 * PAGES
    applied, system = _faults("system")
    assert applied == "system"
    assert system >= 0.9 * ROUNDS * PAGES  # every round faults the whole buffer in again


def test_requested_policy(monkeypatch):
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert allocator.requested_policy() == "kept"
    for value, policy in (("system", "system"), (" SYSTEM ", "system"), ("kept", "kept"),
                          ("", "kept")):
        monkeypatch.setenv(allocator.ENV, value)
        assert allocator.requested_policy() == policy
    monkeypatch.setenv(allocator.ENV, "mmap")
    with pytest.raises(BadInput, match="DL_NFV_ALLOCATOR='mmap': expected kept or system"):
        allocator.requested_policy()
