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
    if len(cpus) < 2:
        return None, "co-run slowdown not measured: one CPU allowed; "
    need = int(peak_bytes * MEMORY_HEADROOM[0] + MEMORY_HEADROOM[1])
    if free_bytes is not None and need > free_bytes:
        return None, (f"co-run slowdown not measured: a second copy of the model would need "
                      f"about {need / 2**30:.1f} GiB, {free_bytes / 2**30:.1f} GiB available; ")
    child = subprocess.Popen(
        [sys.executable, "-c", "from dl_nfv.profilers.corun import child; child()",
         json.dumps({"model": to_data(model), "seed": seed, "cpu": cpus[1]})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        if not _ready(child):
            return None, "co-run slowdown not measured: the second process did not start; "
        os.sched_setaffinity(0, {cpus[0]})
        torch.set_num_threads(1)
        step()  # settle on this core
        alone: list[float] = []
        beside: list[float] = []
        began, pairs = time.perf_counter(), 0
        while pairs < WINDOWS or time.perf_counter() - began < span_s:
            pairs += 1
            _say(child, "pause")
            alone.extend(_window(step))
            _say(child, "go")
            beside.extend(_window(step))
    finally:
        try:
            _say(child, "stop")
            child.stdin.close()
            child.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    a, b = statistics.median(alone), statistics.median(beside)
    slowdown = round(max(1.0, b / a), 4)
    return slowdown, (f"co-run: a 1-thread step {a * 1e3:.3g} ms alone, {b * 1e3:.3g} ms "
                      f"beside a second process stepping on another core (x{slowdown:.4f}, "
                      f"{len(alone)} and {len(beside)} steps); ")


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
    from . import zoo

    workload = zoo.instantiate(model, seed=seed)
    module = workload.module.train()
    inputs, target = workload.make_batch(model.batch_size, seed)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        workload.loss(module(*inputs), target).backward()

    return step


def child() -> None:
    """The second process: pinned to its CPU at one thread, runs the model's plain step
    while told ``go``, stands still while told ``pause``, and ends at ``stop`` (stdin)."""
    args = json.loads(sys.argv[1])
    _settle_child(args["cpu"])
    step = plain_step(from_data(ModelRef, args["model"]), args["seed"])
    step()
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

    threading.Thread(target=listen, daemon=True).start()
    print("ready", flush=True)
    while True:
        with heard:
            while not pending and not stepping:
                heard.wait()
            word = pending.pop(0) if pending else None
        if word == "stop":
            return
        if word is not None:
            stepping = word == "go"
            print(word, flush=True)  # the step before it is done
        if stepping:
            step()
