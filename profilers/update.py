"""The optimizer step and the zeroing of gradients, timed on the profiled model's parameters.

The cost model's default update term is memory traffic at the bandwidth ``profile network``
measures: the fused step's passes (5 for SGD with momentum, 7 for Adam) over the parameter
bytes. That bandwidth is what every worker of a host gets while all of them add at once,
over 256 MiB; one step over a model's parameters is one process streaming through a few
tensors, and on this machine's CPU it ran at twice that rate (fused SGD over MoE's 8.4 MB,
the MLP's 40 MB and ResNet-50's 102 MB: 0.42-0.48 of the modelled time), inside the cache
or not. So a CPU profile times the step itself, as the runtime runs it.

Method
    The runtime's own optimizer (``runtime.executor.make_optimizer``: torch's fused step)
    over every parameter of the module with a learning rate of 0 (the step reads and
    writes what a real one does; the parameters keep their values), timed on one CPU
    thread (the thread's CPU time, as the ops are timed there), each step after writing a
    scratch buffer twice the size of the CPU's last-level cache: the runtime steps right
    after the step's backward, which has run other data through the caches. Timed back to
    back instead, MoE's 25 MB of parameters, gradients and momentum stayed in the 32 MB
    cache and the fused SGD step took 0.66-0.74 ms, against 1.04-1.08 after the scratch
    buffer, 1.10-1.21 after a plain training step and 0.94-1.14 in the runtime's update
    span; a plain step before each would cost minutes on the largest models, the buffer
    milliseconds. One settling round makes the state, then ``rounds``; the fastest (other
    jobs only add time: stopping once two rounds agreed kept 1.14-1.46 ms on a busy
    machine), per optimizer; likewise the zeroing of the gradients (the runtime zeroes its buckets before the next
    step's forward), after the buffer again. Each divided by the parameter bytes gives
    ``ProfileInfo.update_ns_per_byte`` (per optimizer) and ``zero_ns_per_byte``.

Limits: one rate per byte, from the whole model's parameters: a device holding a part pays
that part's share (a part that fits a cache the whole does not may run faster); measured
on one thread and charged at any core count; an optimizer whose state does not fit in
half the free memory is not timed (the model's figure stays); after the buffer the caches
hold none of the step's data, where a backward may leave its last gradients there. Cost:
per round a step, a zeroing of the gradients and two passes over the buffer.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

ROUNDS = 7
DEFAULT_CACHE_BYTES = 32 * 2**20
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def update_rates(module: torch.nn.Module, available_bytes: int | None, rounds: int = ROUNDS,
                 clock=time.thread_time) -> tuple[dict[str, float], float | None, str]:
    """``(ns per parameter byte of each optimizer's step, ns per byte of zeroing the
    gradients, note)`` on one thread (module doc). Restores the thread count and leaves the
    module's parameters as they were, without gradients."""
    from dl_nfv.artifacts import Optimizer
    from dl_nfv.runtime.executor import make_optimizer

    params = [p for p in module.parameters() if p.requires_grad and p.dtype.is_floating_point]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    if not params or nbytes == 0:
        return {}, None, ""
    threads = torch.get_num_threads()
    scratch = torch.empty(2 * last_level_cache_bytes(), dtype=torch.uint8)
    evict_mib = scratch.numel() >> 20
    rates: dict[str, float] = {}
    zeros: list[float] = []
    try:
        torch.set_num_threads(1)
        for kind, states in ((Optimizer.SGD, 1), (Optimizer.ADAM, 2)):
            if available_bytes is not None and states * nbytes > available_bytes / 2:
                continue
            optimizer = make_optimizer(params, kind, lr=0.0)
            steps: list[float] = []
            for r in range(rounds + 1):  # the first makes the state
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                scratch.fill_(r)  # other data through the caches, as a backward's
                c0 = clock()
                optimizer.step()
                c1 = clock()
                scratch.fill_(r)
                c2 = clock()
                for p in params:
                    p.grad.zero_()
                if r:
                    steps.append(c1 - c0)
                    zeros.append(clock() - c2)
            rates[kind.value] = round(min(steps) * 1e9 / nbytes, 5)
            del optimizer
    finally:
        torch.set_num_threads(threads)
        module.zero_grad(set_to_none=True)
        del scratch
    if not zeros:
        return {}, None, ""
    zero = round(min(zeros) * 1e9 / nbytes, 5)
    note = ("optimizer step " + ", ".join(f"{k} {v * nbytes / 1e6:.2f} ms" for k, v in
                                          rates.items())
            + f", zeroing the gradients {zero * nbytes / 1e6:.2f} ms over "
              f"{nbytes / 1e6:.1f} MB of parameters (each after {evict_mib} MiB "
              f"through the caches, fastest "
              f"of {rounds}, 1 thread); ")
    return rates, zero, note


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux's sysfs: cpu0's highest cache level), else 32 MiB."""
    sizes = []
    for path in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")):
        try:
            text = path.read_text().strip()
            sizes.append(int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text))
        except (OSError, ValueError, IndexError):
            continue
    return max(sizes, default=DEFAULT_CACHE_BYTES)
