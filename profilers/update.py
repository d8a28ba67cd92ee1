"""The optimizer step, the zeroing of gradients and a backward's adding into them, timed on
the profiled model's parameters.

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
    thread (the thread's CPU time, as the ops are timed there) where the runtime runs it:
    right after the step's backward, which added into the gradients the runtime keeps
    (``before``: the model's forward, loss and backward at the profiled batch, on that
    thread), and the zeroing of the gradients right after it (the runtime zeroes them
    before the next step's forward, which the update has just passed). What the backward
    leaves in the caches is then what the runtime's update finds there: token pruning's
    fused SGD step (0.15 MB of parameters) took 0.24 ms after a scratch buffer twice the
    last-level cache, 0.08-0.10 ms right after a backward, and 0.088 ms in the runtime's
    update span; the U-Net's (0.47 MB) 0.12-0.16, 0.40-0.42 and 0.5 ms; MoE's (8.4 MB)
    0.94, 0.75 and 0.6-0.9 ms. A model whose plain step is too long to repeat per round
    (``before`` None: its one-thread step over ``profilers.actions.FULL_BATCH_S``) is timed
    after writing that scratch buffer instead (other data through the caches, as a
    backward's; such a model's state is far larger than the cache: ResNet-50's 102 MB
    predicted its update within 3% of the runtime's). One settling round makes the state,
    then ``rounds``; the fastest (other jobs only add time: stopping once two rounds
    agreed kept 1.14-1.46 ms on a busy machine), per optimizer; likewise the zeroing. The
    adding of a new gradient into every parameter's gradient (what autograd does in each
    backward of a step's microbatches: the runtime's gradients are views into its
    buckets, ``runtime.sync``) is timed after the buffer. Each divided by the parameter
    bytes gives ``ProfileInfo.update_ns_per_byte`` (per optimizer), ``zero_ns_per_byte``
    and ``accumulate_ns_per_byte``. The cost model's default for the adding, three passes
    at ``profile network``'s bandwidth, charged MoE's 8.4 MB 0.68 ms per backward; the
    adding itself took 0.26 ms after the buffer (0.19 back to back), and a batch-4
    backward of the whole model ran 0.7 ms faster adding into existing gradients than
    writing new ones.

Limits: one rate per byte, from the whole model's parameters: a device holding a part pays
that part's share (a part that fits a cache the whole does not may run faster); measured
on one thread and charged at any core count; an optimizer whose state does not fit in
half the free memory is not timed (the model's figure stays); after the buffer the caches
hold none of the step's data, where a backward may leave its last gradients there (a
long-stepping model's only). Cost: per round a forward and backward (or two passes over
the buffer), a step, a zeroing of the gradients, and an adding into them after a pass
over the buffer; the adding needs the parameters' size once more, as SGD's state does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

ROUNDS = 7
DEFAULT_CACHE_BYTES = 32 * 2**20
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


class UpdateRates(NamedTuple):
    """What ``update_rates`` measured, ns per parameter byte (empty / None: not timed)."""

    step: dict[str, float]  # per optimizer (``Optimizer`` values)
    zero: float | None  # zeroing the gradients
    accumulate: float | None  # adding a new gradient into them (one backward's)
    note: str


def update_rates(module: torch.nn.Module, available_bytes: int | None, rounds: int = ROUNDS,
                 clock=time.thread_time, before: Callable[[], object] | None = None
                 ) -> UpdateRates:
    """The optimizer steps', the zeroing's and the adding's ns per parameter byte, and a
    note, on one thread (module doc). ``before``: the model's forward and backward (adding
    into the gradients it finds), run before each step so that the step is timed where the
    runtime runs it; None: after a scratch buffer through the caches. Restores the thread
    count and leaves the module's parameters as they were, without gradients."""
    from dl_nfv.artifacts import Optimizer
    from dl_nfv.runtime.executor import make_optimizer

    params = [p for p in module.parameters() if p.requires_grad and p.dtype.is_floating_point]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    if not params or nbytes == 0:
        return UpdateRates({}, None, None, "")
    threads = torch.get_num_threads()
    scratch = torch.empty(2 * last_level_cache_bytes(), dtype=torch.uint8)
    evict_mib = scratch.numel() >> 20
    rates: dict[str, float] = {}
    zeros: list[float] = []
    adds: list[float] = []
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
                if before is not None:
                    before()  # the step's backward, adding into the gradients
                else:
                    scratch.fill_(r)  # other data through the caches, as a backward's
                c0 = clock()
                optimizer.step()
                c1 = clock()
                if before is None:
                    scratch.fill_(r)
                c2 = clock()
                for p in params:
                    p.grad.zero_()
                if r:
                    steps.append(c1 - c0)
                    zeros.append(clock() - c2)
            rates[kind.value] = round(min(steps) * 1e9 / nbytes, 5)
            del optimizer
        if zeros:  # SGD's state fitted: so does a new gradient
            adds = _adding_s(params, scratch, rounds, clock)
    finally:
        torch.set_num_threads(threads)
        module.zero_grad(set_to_none=True)
        del scratch
    if not zeros:
        return UpdateRates({}, None, None, "")
    zero = round(min(zeros) * 1e9 / nbytes, 5)
    accumulate = round(min(adds) * 1e9 / nbytes, 5) if adds else None
    where = (f"the step and the zeroing right after the model's backward, the adding after "
             f"{evict_mib} MiB through the caches" if before is not None
             else f"each after {evict_mib} MiB through the caches")
    adding = (f", adding a backward's gradients into them {accumulate * nbytes / 1e6:.2f} ms"
              if accumulate is not None else "")
    note = ("optimizer step " + ", ".join(f"{k} {v * nbytes / 1e6:.2f} ms" for k, v in
                                          rates.items())
            + f", zeroing the gradients {zero * nbytes / 1e6:.2f} ms{adding} over "
              f"{nbytes / 1e6:.1f} MB of parameters ({where}, fastest of {rounds}, "
              f"1 thread); ")
    return UpdateRates(rates, zero, accumulate, note)


def _adding_s(params: list[torch.Tensor], scratch: torch.Tensor, rounds: int,
              clock) -> list[float]:
    """Seconds of adding a new gradient into every parameter's gradient, each round after
    ``scratch`` went through the caches; the first round settles (module doc). The
    optimizer rounds before it left every parameter a gradient."""
    new = [torch.zeros_like(p) for p in params]
    out = []
    for r in range(rounds + 1):
        scratch.fill_(r)
        c0 = clock()
        for p, g in zip(params, new, strict=True):
            p.grad.add_(g)
        if r:
            out.append(clock() - c0)
    return out


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
