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
    thread (the thread's CPU time, as the ops are timed there) right after a plain
    training step of the model, as the runtime runs it after the step's backward: the
    caches then hold what the backward left, not the optimizer's own data (timed back to
    back, MoE's 25 MB of parameters, gradients and momentum stayed in the 32 MB cache and
    the step took two thirds of what it takes after a backward). One settling round makes
    the state, then up to ``rounds``, stopping once the two fastest lie within ``AGREE``
    (one fast round alone may be luck, two that agree are what the step costs); the
    fastest (other jobs only add time), per optimizer;
    likewise the zeroing of the gradients right after each step (the runtime zeroes its
    buckets before the next step's forward). Each divided by the parameter bytes gives
    ``ProfileInfo.update_ns_per_byte`` (per optimizer) and ``zero_ns_per_byte``.

Limits: one rate per byte, from the whole model's parameters: a device holding a part pays
that part's share (a part that fits a cache the whole does not may run faster); measured
on one thread and charged at any core count; an optimizer whose state does not fit in
half the free memory is not timed (the model's figure stays). Cost: ``2 x 3`` to
``2 x (rounds + 1)`` plain steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

ROUNDS = 5
AGREE = 0.05  # two steps this close: the fastest is what the step costs


def update_rates(module: torch.nn.Module, backward: Callable[[], object],
                 available_bytes: int | None, rounds: int = ROUNDS, clock=time.thread_time
                 ) -> tuple[dict[str, float], float | None, str]:
    """``(ns per parameter byte of each optimizer's step, ns per byte of zeroing the
    gradients, note)`` on one thread (module doc); ``backward`` runs a plain step of the
    model (its forward and backward), which leaves every parameter a gradient. Restores the
    thread count and leaves the module's parameters as they were, without gradients."""
    from dl_nfv.artifacts import Optimizer
    from dl_nfv.runtime.executor import make_optimizer

    params = [p for p in module.parameters() if p.requires_grad and p.dtype.is_floating_point]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    if not params or nbytes == 0:
        return {}, None, ""
    threads = torch.get_num_threads()
    rates: dict[str, float] = {}
    zeros: list[float] = []
    made = 0
    try:
        torch.set_num_threads(1)
        for kind, states in ((Optimizer.SGD, 1), (Optimizer.ADAM, 2)):
            if available_bytes is not None and states * nbytes > available_bytes / 2:
                continue
            optimizer = make_optimizer(params, kind, lr=0.0)
            steps: list[float] = []
            for r in range(rounds + 1):  # the first makes the state
                if len(steps) >= 2 and _agree(steps):
                    break
                backward()
                for p in params:  # (a parameter the step did not reach)
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                c0 = clock()
                optimizer.step()
                c1 = clock()
                for p in params:
                    p.grad.zero_()
                if r:
                    steps.append(c1 - c0)
                    zeros.append(clock() - c1)
            rates[kind.value] = round(min(steps) * 1e9 / nbytes, 5)
            made = max(made, len(steps))
            del optimizer
    finally:
        torch.set_num_threads(threads)
        module.zero_grad(set_to_none=True)
    if not zeros:
        return {}, None, ""
    zero = round(min(zeros) * 1e9 / nbytes, 5)
    note = ("optimizer step " + ", ".join(f"{k} {v * nbytes / 1e6:.2f} ms" for k, v in
                                          rates.items())
            + f", zeroing the gradients {zero * nbytes / 1e6:.2f} ms over "
              f"{nbytes / 1e6:.1f} MB of parameters (each right after a plain step, fastest "
              f"of up to {made} rounds, 1 thread); ")
    return rates, zero, note


def _agree(times: list[float]) -> bool:
    """True when the two fastest of ``times`` lie within ``AGREE`` of each other."""
    first, second = sorted(times)[:2]
    return second <= first * (1 + AGREE)
