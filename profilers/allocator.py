"""The heap policy of every process that times training work: freed memory stays mapped.

glibc hands a block above its mmap threshold (at most 32 MiB) back to the
kernel when it is freed, and trims the top of its heap, so a buffer of the
same size allocated again in the next step is faulted in page by page (and
zeroed by the kernel) once more. A training step allocates and frees the same
sizes every step: GPT-2's embedding gradient (154 MB), its logits, each
layer's weight gradient. On this project's virtual machines a fault costs
several microseconds and varies with the host: zeroing GPT-2's embedding
gradient took 60 ms in one process and 350-400 ms in another, and a 2-stage
GPT-2 pipeline took 2.8 million page faults per run against 0.9 million with
freed memory kept (the rest are start-up), and 1644-2019 ms a step against
2165-2412. A GPU framework keeps freed memory in a caching allocator for the
same reason.

``keep_freed_memory`` makes glibc serve every allocation from its heap
(``M_MMAP_MAX = 0``) and keep what is freed (``M_TRIM_THRESHOLD`` at its
largest), so a process's steady state touches no new pages. The profiler, the
network probe and every training worker call it before they time anything, so
the op graph's times and the runs they predict pay the same memory costs. The
price is memory: a process's resident size stays at its peak (GPT-2's 2-stage
pipeline: 1.94 GB against 1.84 GB per worker).

``DL_NFV_ALLOCATOR=system`` leaves the C library's policy alone (and is what a
process without glibc's ``mallopt`` gets). The policy in force is recorded in
the op graph's profile (``ProfileInfo.allocator``).
"""

from __future__ import annotations

import ctypes
import os

from dl_nfv.artifacts import BadInput

KEPT = "kept"  # every allocation from the heap, nothing handed back
SYSTEM = "system"  # the C library's own policy
ENV = "DL_NFV_ALLOCATOR"

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_applied: str | None = None


def requested_policy() -> str:
    """The policy ``DL_NFV_ALLOCATOR`` asks for (default ``kept``); ``BadInput`` for another."""
    value = os.environ.get(ENV, KEPT).strip().lower() or KEPT
    if value not in (KEPT, SYSTEM):
        raise BadInput(f"environment variable {ENV}={os.environ[ENV]!r}: expected {KEPT} or {SYSTEM}")
    return value


def keep_freed_memory() -> str:
    """Apply the requested policy to this process once; returns the policy in force."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = SYSTEM
    if requested_policy() == KEPT:
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):  # no glibc (musl, macOS)
            return _applied
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        if mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _INT_MAX) == 1:
            _applied = KEPT
    return _applied
