"""Co-run slowdown: how much slower the model's step runs on one core while a second
process runs the same step on another core of the machine.

Devices of one host that are cores of one CPU share its last-level cache and memory
bandwidth (and, in a virtual machine, whatever the host's other tenants leave), so two
training processes computing at once each run slower than either alone. The profile
measures it on the model itself: a child process, pinned to the second allowed CPU and on
the heap policy of the profile and the workers (``allocator``), runs
plain steps at one thread while this process, pinned to the first, times its own plain
steps at one thread (wall clock) in alternating windows, the child paused, then
stepping, then paused again and stepping again, and so on until the windows span the
profile's ``span_s`` (the other tenants of a shared machine press on the cache more in
some seconds than in others: MoE's slowdown came out 1.05-1.21 from two pairs of
windows a quarter of a second each). The slowdown is the median step beside
the child over the median step alone (at least 1). ``simulator`` charges it on compute
that overlaps compute of another device of the same host, in proportion to the data
those devices hold beyond one copy of the model's (docs/simulator.md).

The update (the optimizer's step and the zeroing of the gradients) streams the model's
parameters, gradients and optimizer state through the caches and memory, and slows beside
a neighbour far more than the forward and backward do (beside a second process running the
same training iteration: MoE's forward and backward x1.13, the MLP's x1.05; the MLP's
zeroing alone x1.78; the runtime's data parallelism updated MoE, the MLP and GPT-2 1.65-2.3x
slower than one device did). So it is measured apart
(``update_co_run_slowdown``): the child, told ``one``, runs one training iteration (the
forward, loss and backward into its kept gradients, its optimizer's step at a learning
rate of 0, the zeroing of the gradients) beside one of this process's, the two updates
starting together once both backwards are done, as data-parallel replicas update after
their gradients' AllReduce (started together at the forward only, GPT-2's second-long
iterations drifted apart and their 57 ms updates barely overlapped: x1.03 against x1.67 in
the runtime); the slowdown is the median update (this process's step and zeroing, wall
clock) of windows of such iterations over that of windows alone, taking turns as above
(MoE x1.66, the MLP x1.70, GPT-2 x1.70).

Limits: two processes only (the figure for more is not measured; the simulator scales
it by how many others compute, linearly), the same model on both (a different neighbour
slows it by a different amount), and what the machine's other load does during the
windows.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from dl_nfv.artifacts import ModelRef, from_data, to_data

WINDOW_S = 0.25  # each window: at least this long and MIN_STEPS steps,
MIN_STEPS = 3
LONG_WINDOW_S = 2.0  # or one step where MIN_STEPS of them would take longer than this
WINDOWS = 2  # alone, beside, alone, beside
READY_TIMEOUT_S = 180.0
# a second process's memory: its step's peak of live tensors times this, plus this many bytes
# (the interpreter, torch, and the heap the allocator policy keeps)
MEMORY_HEADROOM = (1.5, 2**30)


def co_run_slowdown(model: ModelRef, seed: int, step, cpus: list[int], span_s: float = 0.0,
                    peak_bytes: int = 0, free_bytes: int | None = None
                    ) -> tuple[float | None, str]:
    """``(slowdown, note)`` of ``step`` (a callable running one plain step of ``model``
    here) beside a second process running ``model``'s step, over ``WINDOWS`` pairs of
    windows or more until they span ``span_s`` seconds; ``(None, why)`` when there is no
    second CPU, when a second copy of the model (its step's ``peak_bytes`` of live tensors,
    with ``MEMORY_HEADROOM``) would not fit in ``free_bytes`` (None: not known, tried), or
    when the second process did not start."""
    what = "co-run slowdown"
    why = _unmeasurable(what, cpus, peak_bytes, free_bytes)
    if why:
        return None, why
    with _neighbour(model, seed, cpus) as child:
        if child is None:
            return None, f"{what} not measured: the second process did not start; "
        step()  # settle on this core

        def alone() -> list[float]:
            _say(child, "pause")
            return _window(step)

        def beside() -> list[float]:
            _say(child, "go")
            return _window(step)

        a, b, slowdown, counts = _taking_turns(alone, beside, span_s)
    return slowdown, (f"co-run: a 1-thread step {a * 1e3:.3g} ms alone, {b * 1e3:.3g} ms "
                      f"beside a second process stepping on another core (x{slowdown:.4f}, "
                      f"{counts[0]} and {counts[1]} steps); ")


def update_co_run_slowdown(model: ModelRef, seed: int, iteration, cpus: list[int],
                           span_s: float = 0.0, peak_bytes: int = 0,
                           free_bytes: int | None = None) -> tuple[float | None, str]:
    """``(slowdown, note)`` of the update: ``iteration`` (a callable running one training
    iteration of ``model`` here and returning the wall seconds of its update: the
    optimizer's step and the zeroing of the gradients) in lockstep with a second process's
    iterations, over alone (module doc), in ``WINDOWS`` pairs of windows or more until they
    span ``span_s`` seconds; ``(None, why)`` as ``co_run_slowdown``. ``peak_bytes``: the
    second process's step's live tensors and its optimizer's state."""
    what = "update co-run slowdown"
    why = _unmeasurable(what, cpus, peak_bytes, free_bytes)
    if why:
        return None, why
    with _neighbour(model, seed, cpus) as child:
        if child is None:
            return None, f"{what} not measured: the second process did not start; "
        iteration()  # settle on this core

        def together() -> None:  # both backwards done: both update at once
            child.stdout.readline()
            child.stdin.write("update\n")
            child.stdin.flush()

        def lockstep() -> float:
            child.stdin.write("one\n")
            child.stdin.flush()
            seconds = iteration(before_update=together)
            child.stdout.readline()  # its iteration is done
            return seconds

        a, b, slowdown, counts = _taking_turns(lambda: _timed_window(iteration),
                                               lambda: _timed_window(lockstep), span_s)
    return slowdown, (f"update co-run: the 1-thread update {a * 1e3:.3g} ms alone, "
                      f"{b * 1e3:.3g} ms in lockstep with a second process's training "
                      f"iterations on another core (x{slowdown:.4f}, {counts[0]} and "
                      f"{counts[1]} iterations); ")


def _unmeasurable(what: str, cpus: list[int], peak_bytes: int, free_bytes: int | None
                  ) -> str:
    """Why ``what`` cannot be measured ("" if it can): one CPU allowed, or a second copy of
    the model (``peak_bytes`` with ``MEMORY_HEADROOM``) would not fit in ``free_bytes``."""
    if len(cpus) < 2:
        return f"{what} not measured: one CPU allowed; "
    need = int(peak_bytes * MEMORY_HEADROOM[0] + MEMORY_HEADROOM[1])
    if free_bytes is not None and need > free_bytes:
        return (f"{what} not measured: a second copy of the model would need about "
                f"{need / 2**30:.1f} GiB, {free_bytes / 2**30:.1f} GiB available; ")
    return ""


def _taking_turns(alone, beside, span_s: float
                  ) -> tuple[float, float, float, tuple[int, int]]:
    """Windows ``alone()`` and ``beside()`` (each returns its seconds) taking turns,
    ``WINDOWS`` pairs or more until they span ``span_s``: the median alone, the median
    beside, their ratio (at least 1, rounded) and how many of each."""
    times: tuple[list[float], list[float]] = ([], [])
    began, pairs = time.perf_counter(), 0
    while pairs < WINDOWS or time.perf_counter() - began < span_s:
        pairs += 1
        times[0].extend(alone())
        times[1].extend(beside())
    a, b = statistics.median(times[0]), statistics.median(times[1])
    return a, b, round(max(1.0, b / a), 4), (len(times[0]), len(times[1]))


@contextmanager
def _neighbour(model: ModelRef, seed: int, cpus: list[int]) -> Iterator[subprocess.Popen | None]:
    """The second process (``child``) on ``cpus[1]``, and this one pinned to ``cpus[0]`` at
    one thread, for the block; None if it did not start. Stops it and restores this
    process's CPUs and threads afterwards."""
    child = subprocess.Popen(
        [sys.executable, "-c", "from dl_nfv.profilers.corun import child; child()",
         json.dumps({"model": to_data(model), "seed": seed, "cpu": cpus[1]})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        if not _ready(child):
            yield None
            return
        os.sched_setaffinity(0, {cpus[0]})
        torch.set_num_threads(1)
        yield child
    finally:
        try:
            _say(child, "stop")
            child.stdin.close()
            child.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def _ready(child: subprocess.Popen) -> bool:
    """Wait for the child's ``ready`` line (it has built the model and run one step)."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(child.stdout.readline()), daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_S)
    return bool(line) and line[0].strip() == "ready"


def _say(child: subprocess.Popen, word: str) -> None:
    """Tell the child to ``go``, ``pause`` or ``stop``, and wait for its answer (it has
    finished the step it was in)."""
    child.stdin.write(word + "\n")
    child.stdin.flush()
    if word != "stop":
        child.stdout.readline()


def _timed_window(iteration) -> list[float]:
    """``_window`` of ``iteration``, a callable that returns the seconds to keep of it (the
    window's length is its whole wall time)."""
    kept: list[float] = []

    def run() -> None:
        kept.append(iteration())

    _window(run)
    return kept


def _window(step) -> list[float]:
    """Wall seconds of each step over one window: ``MIN_STEPS`` of them and at least
    ``WINDOW_S``, or as many as fit in ``LONG_WINDOW_S`` and at least one (a step of seconds
    runs through thousands of kernels, and one of them varies little: ResNet-50's at batch
    32 takes 5-6 s at one thread, and three per window would make this probe the longest
    part of its profile)."""
    times: list[float] = []
    began = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - began
        enough = bool(times) and (len(times) >= MIN_STEPS or elapsed + times[-1] > LONG_WINDOW_S)
        if enough and elapsed >= WINDOW_S:
            return times
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)


def _settle_child(cpu: int) -> str:
    """The second process's set-up: the heap policy of the profile and of every training
    worker (``allocator.keep_freed_memory``: on glibc's own policy its steps fault their
    buffers in page by page, spend much of the step in the kernel and press on the shared
    cache far less than a worker does: MoE's step 1.01x beside such a neighbour, 1.27-1.39x
    beside one that keeps its heap), pinned to ``cpu`` at one thread. Returns the policy."""
    from .allocator import keep_freed_memory

    policy = keep_freed_memory()
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    return policy


def plain_step(model: ModelRef, seed: int):
    """A callable running one plain step of ``model`` (built as the profile builds it, at
    its batch): the gradients reset, the forward with the loss, the backward."""
    return _resetting(*_model(model, seed))


def _resetting(module: torch.nn.Module, backward):
    """``backward`` with the gradients reset (freed) before it: a plain step."""

    def step() -> None:
        module.zero_grad(set_to_none=True)
        backward()

    return step


def _model(model: ModelRef, seed: int):
    """``(module, backward)``: ``model`` built as the profile builds it, and a callable
    running its forward with the loss and the backward at its batch, adding into the
    gradients it finds."""
    from . import zoo

    workload = zoo.instantiate(model, seed=seed)
    module = workload.module.train()
    inputs, target = workload.make_batch(model.batch_size, seed)

    def backward() -> None:
        workload.loss(module(*inputs), target).backward()

    return module, backward


def training_iteration(module: torch.nn.Module, step, clock=time.perf_counter):
    """A callable running one training iteration of ``module`` as the runtime does: ``step``
    (forward, loss and backward, adding into the gradients), the fused SGD step at a
    learning rate of 0 (the parameters keep their values) and the zeroing of the gradients
    (kept, not freed, as the runtime's buckets); it returns the wall seconds of the update
    (the optimizer's step and the zeroing, as the simulator's update task holds both).
    Called with ``before_update``, it calls that between the backward and the update."""
    from dl_nfv.artifacts import Optimizer
    from dl_nfv.runtime.executor import make_optimizer

    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, Optimizer.SGD, lr=0.0)

    def iteration(before_update: Callable[[], object] | None = None) -> float:
        step()
        if before_update is not None:
            before_update()
        t0 = clock()
        if optimizer is not None:
            optimizer.step()
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        return clock() - t0

    return iteration


def child() -> None:
    """The second process: pinned to its CPU at one thread, runs the model's plain step
    while told ``go``, stands still while told ``pause``, runs one training iteration
    (``training_iteration``) and says ``done`` when told ``one``, and ends at ``stop``
    (stdin). In an iteration it says ``backward`` when its backward is done and waits for
    ``update`` to update, so that the two processes' updates start together, as the
    replicas' do after their gradients' AllReduce."""
    args = json.loads(sys.argv[1])
    _settle_child(args["cpu"])
    module, backward = _model(from_data(ModelRef, args["model"]), args["seed"])
    step = _resetting(module, backward)
    step()
    iteration = None
    stepping = False
    pending: list[str] = []
    heard = threading.Condition()

    def listen() -> None:
        for line in sys.stdin:
            with heard:
                pending.append(line.strip())
                heard.notify()
        with heard:
            pending.append("stop")
            heard.notify()

    def next_word() -> str:
        with heard:
            while not pending:
                heard.wait()
            return pending.pop(0)

    threading.Thread(target=listen, daemon=True).start()
    print("ready", flush=True)
    while True:
        with heard:
            while not pending and not stepping:
                heard.wait()
            word = pending.pop(0) if pending else None
        if word == "stop":
            return
        if word == "one":
            iteration = iteration or training_iteration(module, backward)
            iteration(before_update=lambda: (print("backward", flush=True), next_word()))
            print("done", flush=True)
            continue
        if word is not None:
            stepping = word == "go"
            print(word, flush=True)  # the step before it is done
        if stepping:
            step()
