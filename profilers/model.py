"""``profile_model``: a model (zoo name or user callable) into a measured op graph.

Steps
    1. Build the workload (``zoo.instantiate``) and a synthetic batch, move
       them to the device, and trace the module (``capture.capture``).
    2. Counting pass: one instrumented training step under ``CostCounter``
       records every op's FLOPs (forward and backward), bytes accessed,
       activation bytes and every node's output size (for the edges), and the
       peak of live tensor memory. It doubles as the first warm-up. A second
       step asks autograd for the gradients of the activations alone and counts
       the backward FLOPs that compute input gradients (``bwd_input_flops``; the
       rest compute weight gradients, which a pipeline may defer).
    3. ``warmup`` more plain steps, untimed (default none: the counting pass
       already ran every kernel at full size).
    4. ``repeats`` rounds of one plain step (timed whole) and one instrumented
       step (timed per op), more until the rounds span ``span_s`` seconds
       (``--span``, default ``SPAN_S``: the medians of a few milliseconds' rounds
       are one moment of a shared machine), and more (up to ``MAX_ROUND_FACTOR``
       times as many, for at most ``EXTRA_ROUNDS_S`` of added rounds) while the
       medians are not yet known well enough (``rounds``: the per-op
       sum within 2%, noisy ops under a tenth of it); the graph records per-op
       medians (less the instrumentation's cost per event, measured against the
       plain steps: ``measure``) and the median whole step, and ``ProfileInfo`` states the ratio
       of the per-op sum to the step and the spread of the rounds. The process
       is pinned to as many CPUs as it has threads, as the runtime pins a worker. An op that owns a tied weight also records the part of its
       backward that sums the weight's gradients from its uses (``tie_sum_ms``,
       the median of the same rounds; ``measure`` says how it is cut out).
    5. With ``batch_scaling`` (the default) and a batch of at least 2, each
       round of step 4 is followed by one more instrumented step at an eighth of
       the batch (``b = max(1, B // SCALING_DIVISOR)``: the size of a microbatch
       or of a small replica's share, where the affine model below matters
       most), so that both batches are timed in the same spell of a shared
       machine: its small, memory-bound shapes are the ones whose speed moves
       most from one minute to the next (GPT-2 small's 3072x768 backward at one
       sample: 5.0-7.6 ms across profiles, at four samples within 10%).
       Each op's time is modelled as ``fixed + (t - fixed) x f`` at a fraction
       ``f`` of the batch (the cost model's scaling); the two medians give its
       batch-independent part ``fixed = (t_b - t f) / (1 - f)`` with
       ``f = b / B``, clipped to ``[0, t]`` (``fwd_fixed_ms``/``bwd_fixed_ms``).
       On a CPU most of it is reading and packing the weights of small-batch
       matmuls; it decides how data-parallel replicas and microbatches scale.
       Each such step runs after an untimed plain step at the smaller batch: the
       plain step whose time the instrumentation's cost is taken against would
       otherwise run right after the instrumented full-batch step and pay for
       what that left in the caches (MoE's forward at 4 rows: 0.9-1.1 ms there,
       0.5-0.6 ms after a plain step of its own size), which makes the cost per
       event too small and every small-batch op too slow.
    6. On a CPU (``thread_scaling``, the default), every op is timed again at
       1 thread and at this process's CPU count, where the profile's own
       threads are neither (pinned, rounds by the same rule, each with its
       plain step, which settles the thread pool for the instrumented step that
       follows, and its step at the smaller batch; where a step there is longer
       than ``SETTLE_ONLY_S`` one plain step settles the pass, and the
       instrumentation's cost per event comes from the smaller batch alone):
       ``Op.fwd_ms_by_threads`` / ``bwd_ms_by_threads``, the fixed parts at
       those counts (``fwd_fixed_ms_by_threads``), and
       ``ProfileInfo.thread_counts``. The instrumentation's cost per event is
       the 1-thread pass's at the same batch (there the clock is the thread's CPU
       time). The cost model interpolates each op
       between them to a device's cores, so one profile serves a plan whatever
       cores its devices have (``simulator/extrapolation.py``).
    7. On a CPU, the training runtime's CPU per unit action and per turn between forward
       and backward (``actions``), the optimizer
       step (``update``), and, with ``thread_scaling`` and two CPUs or more, the co-run
       slowdown: the plain step at one thread beside a second process stepping the same
       model on another CPU, over the step alone (``corun``;
       ``ProfileInfo.co_run_slowdown``).

Costs scale with the model: the two counting passes plus ``warmup + 2 * rounds``
training steps (and ``3 * rounds`` small-batch steps; ``repeats <= rounds <= 4 repeats``
where the step is long, up to ``MAX_SPAN_ROUNDS`` where ``span_s`` takes more),
``1 + 2 * rounds`` steps per other thread count (and ``3 * rounds`` small ones), and O(nodes)
bookkeeping per step.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch

from dl_nfv.artifacts import (
    CATALOG,
    BadInput,
    DlNfvError,
    Granularity,
    ModelRef,
    OpGraph,
    ProfileInfo,
)

from . import zoo
from .actions import FULL_BATCH_S, UnitActions, loss_figures, unit_action_ms
from .allocator import keep_freed_memory
from .capture import Capture, capture
from .corun import co_run_slowdown, training_iteration, update_co_run_slowdown
from .counting import CostCounter, MemoryLimitExceeded
from .devices import catalog_name_of_cuda
from .graph import build_ops
from .measure import (
    LOSS,
    Recorder,
    TimedRounds,
    bounded_overhead,
    machine_name,
    make_clock,
    time_plain_step,
)
from .probe import PROBE_ROWS, colocation_groups, probe
from .rounds import SPAN_S, allowed_cpus, pin, relative_iqr, round_indices, stability
from .update import UpdateRates, update_rates

Progress = Callable[[str, int, int], None]
# the fixed parts of op times are measured at batch B // SCALING_DIVISOR (at least 1)
SCALING_DIVISOR = 8
SETTLE_ONLY_S = 1.0  # a thread pass with longer steps: one plain step, not one per round
GIB = 2**30


def default_granularity(model: ModelRef) -> Granularity:
    """The zoo entry's default granularity (layer for the largest models), else op."""
    if model.source == "zoo":
        return zoo.lookup(model.name).default_granularity
    return Granularity.OP


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BadInput(f"--device {device!r}: expected cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"--device {device}: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise BadInput(f"--device {device!r}: only cpu and cuda are supported")
    return dev


def available_memory_bytes(dev: torch.device) -> int | None:
    """Memory free for new tensors: CUDA's free memory, or Linux's MemAvailable; None if unknown."""
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _check_parameter_memory(model: ModelRef, dev: torch.device) -> None:
    """Refuse a zoo model whose parameters and gradients alone exceed the free memory."""
    if model.source != "zoo":
        return
    available = available_memory_bytes(dev)
    itemsize = zoo.DTYPES[model.dtype].itemsize
    need = 2 * zoo.parameter_count(model.name) * itemsize
    if available is not None and need > available:
        raise BadInput(f"model {model.name!r} needs {need / GIB:.1f} GiB for its parameters and "
                       f"their gradients, but only {available / GIB:.1f} GiB are available on "
                       f"{dev.type}")


def profile_model(model: ModelRef, *, granularity: Granularity | str | None = None,
                  repeats: int = 3, warmup: int = 0, threads: int | None = None, seed: int = 0,
                  device: str = "auto", device_type: str | None = None,
                  leaf_modules: Iterable[str] = (), batch_scaling: bool = True,
                  thread_scaling: bool = True, span_s: float = SPAN_S,
                  progress: Progress | None = None) -> OpGraph:
    """Profile ``model`` on the local device into an ``OpGraph`` (see the module doc).

    Parameters
    ----------
    model : what to profile (``zoo.model_ref`` builds it from names and options).
    granularity : ``op`` or ``layer``; default: the zoo entry's default, else ``op``.
    repeats, warmup : timed rounds (>= 1) and extra untimed steps (>= 0).
    threads : intra-op CPU threads (``torch.set_num_threads``); default: torch's.
    seed : seeds the parameters, the batch and dropout.
    device : ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``.
    device_type : catalog name to record times under (default: ``cpu``, or the
        catalog type of the CUDA device).
    leaf_modules : module names or classes traced as opaque ops.
    batch_scaling : also time every op at an eighth of the batch, to measure the part of
        its time that does not shrink with the batch (see the module doc).
    thread_scaling : on a CPU, also time every op at 1 thread and at this process's CPU
        count where ``threads`` is neither (module doc, step 6).
    span_s : the least wall time (seconds) each timing pass and probe spans, adding rounds
        until it is reached (``rounds`` module doc); 0: ``repeats`` rounds alone.
    progress : called as ``progress(description, done, total)`` after each step.

    Raises ``BadInput`` (unknown model, bad shapes, a model that fails on its
    inputs or cannot be traced). Deterministic in everything but the times.
    """
    if repeats < 1:
        raise BadInput(f"--repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise BadInput(f"--warmup must be >= 0, got {warmup}")
    if span_s < 0:
        raise BadInput(f"--span must be >= 0, got {span_s}")
    if threads is not None and threads < 1:
        raise BadInput(f"--threads must be >= 1, got {threads}")
    if device_type is not None and device_type not in CATALOG:
        raise BadInput(f"--device-type {device_type!r}: not in the catalog ({', '.join(CATALOG)})")
    granularity = Granularity(granularity) if granularity else default_granularity(model)
    dev = resolve_device(device)
    type_name = device_type or ("cpu" if dev.type == "cpu" else catalog_name_of_cuda(dev))
    leaves = tuple(leaf_modules)
    allocator = keep_freed_memory()
    previous_threads = torch.get_num_threads()
    cpus = allowed_cpus() if dev.type == "cpu" else []
    main = threads or previous_threads
    counts = sorted({main, 1, len(cpus)} - {0}) if thread_scaling and cpus else [main]
    try:
        torch.set_num_threads(main)
        pin(main, cpus)
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            return _profile(model, granularity, repeats, span_s, warmup, seed, dev, type_name,
                            leaves, batch_scaling, progress, allocator, counts,
                            cpus if thread_scaling else [])
    finally:
        torch.set_num_threads(previous_threads)
        if cpus:
            os.sched_setaffinity(0, cpus)


def _profile(model, granularity, repeats, span_s, warmup, seed, dev, type_name, leaves,
             batch_scaling, progress, allocator, thread_counts, cpus):
    small = max(1, model.batch_size // SCALING_DIVISOR) if batch_scaling and model.batch_size > 1 else 0
    per_round = 3 if small else 2
    others = [n for n in thread_counts if n != torch.get_num_threads()]
    total = 2 + warmup + per_round * repeats + repeats * len(others) + 4 * (dev.type == "cpu")
    done = 0

    def tick(what: str, more: int = 0) -> None:
        nonlocal done, total
        done, total = done + 1, total + more
        if progress is not None:
            progress(what, done, total)

    _check_parameter_memory(model, dev)
    workload = zoo.instantiate(model, seed=seed)
    module = workload.module.to(dev).train()
    inputs, target = workload.make_batch(model.batch_size, seed)
    inputs = tuple(t.to(dev) for t in inputs)
    target = None if target is None else target.to(dev)
    cap = capture(module, inputs, granularity=granularity, leaf_modules=leaves)

    def loss_fn(output):
        return workload.loss(output, target)

    clock = make_clock(dev)
    counter = CostCounter()
    counter.track([*module.parameters(), *module.buffers(), *inputs])
    available = available_memory_bytes(dev) if dev.type == "cpu" else None
    if available is not None:  # keep a tenth in reserve for everything that is not a tensor
        counter.memory_limit_bytes = counter.live_bytes + int(0.9 * available)
    recorder = Recorder(cap, clock, counter)
    with _model_errors(model, cap):
        with counter:
            recorder.run(inputs, loss_fn, record_meta=True)
    module.zero_grad(set_to_none=True)
    peak_bytes = counter.peak_bytes
    tick("counting FLOPs and bytes")
    input_counter = _input_gradient_pass(cap, module, inputs, loss_fn, clock, model, counter)
    tick("counting the FLOPs of input gradients")

    def plain_step() -> tuple[float, float]:
        return time_plain_step(module, inputs, loss_fn, clock)

    with _model_errors(model, cap):
        for _ in range(warmup):
            plain_step()
            tick("warming up")
        smaller = _SmallBatchRounds(cap, workload, small, seed, dev) if small else None
        timed = TimedRounds(cap)
        steps, cuda_peak = _rounds(cap, clock, module, inputs, loss_fn, plain_step, smaller,
                                   timed, repeats, span_s, dev, tick)
        peak_bytes = cuda_peak if cuda_peak is not None else peak_bytes
        passes = {n: _thread_pass(n, cap, clock, module, inputs, loss_fn, plain_step, repeats,
                                  span_s, tick, workload, small, seed, dev, cpus,
                                  plain_rounds=not _settle_only(steps, n, smaller))
                  for n in others}
    module.zero_grad(set_to_none=True)

    # the instrumentation is Python on the calling thread: its cost per event is measured
    # where the clock is that thread's CPU time (1 thread), at each batch against that
    # batch's plain steps, and taken off at every thread count
    # (bounded by the smaller batch's, where the step is short: measure.bounded_overhead)
    one_threads = 1 if 1 in passes or torch.get_num_threads() == 1 else torch.get_num_threads()
    one, one_small = passes.get(1, (timed, smaller))
    per_event_small = (one_small.timed.per_event_ms()
                       if one_small is not None and not one_small.failed else None)
    per_event = (bounded_overhead(one.per_event_ms(), per_event_small) if dev.type == "cpu"
                 else (0.0, 0.0))
    per_event_small = per_event_small if dev.type == "cpu" and per_event_small else per_event
    fwd_runs, bwd_runs = timed.fwd_runs, timed.bwd_runs
    cold = one_small.cold_ms() if one_small is not None and dev.type == "cpu" else (None, None)
    fwd_ms, bwd_ms = timed.medians_ms(per_event)
    raw_fwd, raw_bwd = timed.medians_ms((0.0, 0.0))
    taken_ms = sum(raw_fwd[o] + raw_bwd[o] - fwd_ms[o] - bwd_ms[o] for o in cap.op_ids)
    tie_ms = {k: statistics.median(v) * 1e3 for k, v in timed.tie_runs.items()}  # capped by build_ops
    fixed, scaling_note = (smaller.fixed_parts(model.batch_size, fwd_ms, bwd_ms, per_event_small)
                           if smaller else ({}, ""))
    at_threads = {n: _pass_result(t, sm, model.batch_size, (per_event, per_event_small),
                                  cap.op_ids)
                  for n, (t, sm) in passes.items()}
    ops, edges = build_ops(cap, counter, recorder.value_meta, fwd_ms, bwd_ms, type_name,
                           model.batch_size, fixed, tie_ms, input_counter.bwd_flops)
    ops = _with_thread_times(ops, at_threads)
    scaling_note = (f"{_overhead_note(per_event, one_threads, taken_ms)}"
                    f"{_overhead_note(per_event_small, one_threads, None, smaller.small) if fixed else ''}"
                    f"{scaling_note}")
    options = dict(model.options)
    if leaves:
        options["leaf_modules"] = list(leaves)
    colocation, colocation_note = _runtime_colocation(cap, workload, seed, dev)
    actions = UnitActions(None, None, None, "")
    co_run, co_run_note = None, ""
    update_co_run, update_co_run_note = None, ""
    rates = UpdateRates({}, None, None, "")
    if dev.type == "cpu":
        step_1t_s = _one_thread_step_s(steps, passes)
        actions = unit_action_ms(cap, workload, module, model.batch_size, seed,
                                 step_s=step_1t_s, span_s=span_s)
        tick("timing the runtime's unit actions")

        def backward() -> None:  # the step before the runtime's update, into its gradients
            loss_fn(module(*inputs)).backward()

        rates = update_rates(module, available_memory_bytes(dev),
                             before=backward if step_1t_s <= FULL_BATCH_S else None)
        tick("timing the optimizer update")
        with _model_errors(model, cap):
            co_run, co_run_note = co_run_slowdown(model, seed, plain_step, cpus, span_s,
                                                  peak_bytes, available_memory_bytes(dev))
        module.zero_grad(set_to_none=True)
        tick("timing the step beside a second process")
        with _model_errors(model, cap):
            update_co_run, update_co_run_note = update_co_run_slowdown(
                model, seed, training_iteration(module, backward), cpus, span_s,
                peak_bytes + sum(p.numel() * p.element_size() for p in module.parameters()),
                available_memory_bytes(dev))
        module.zero_grad(set_to_none=True)
        tick("timing the update beside a second process")
    ref = ModelRef(name=model.name, source=model.source, batch_size=model.batch_size,
                   dtype=model.dtype, inputs=model.inputs, options=options)
    machine = machine_name(dev)
    info = _info(cap, steps, fwd_runs, bwd_runs, fwd_ms, bwd_ms, at_threads, type_name, warmup,
                 peak_bytes, small if fixed else None, allocator,
                 _overhead_field(per_event, per_event_small if fixed else None, taken_ms)
                 | {name: None if ms is None else round(ms, 4)
                    for name, ms in (("unit_action_ms", actions.unit_ms),
                                     ("op_action_ms", actions.op_ms),
                                     ("turn_ms", actions.turn_ms))}
                 | {"update_ns_per_byte": rates.step, "zero_ns_per_byte": rates.zero,
                    "accumulate_ns_per_byte": rates.accumulate,
                    "co_run_slowdown": co_run, "update_co_run_slowdown": update_co_run,
                    "cold_fwd_ms": cold[0], "cold_bwd_ms": cold[1],
                    "machine": machine}
                 | loss_figures(one, one_small, model.batch_size, per_event, per_event_small),
                 f"{scaling_note}{actions.note}{rates.note}{co_run_note}{update_co_run_note}{_threads_note(at_threads, sum(fwd_ms[o] + bwd_ms[o] for o in cap.op_ids))}"
                 f"seed {seed}; {machine}{colocation_note}")
    return OpGraph(model=ref, granularity=granularity, profile=info, ops=ops, edges=edges,
                   colocation=colocation)


def _info(cap, steps, fwd_runs, bwd_runs, fwd_ms, bwd_ms, at_threads, type_name, warmup,
          peak_bytes, scaling_batch_size, allocator, overhead, note_tail) -> ProfileInfo:
    """The ``ProfileInfo`` of the rounds: medians, their spread and the check's ratios."""
    round_sums = _round_sums_s(fwd_runs, bwd_runs, cap.op_ids)
    step_ms = statistics.median(steps) * 1e3
    op_sum_ms = sum(fwd_ms[o] + bwd_ms[o] for o in cap.op_ids)
    loss_ms = fwd_ms[LOSS] + bwd_ms[LOSS]
    spread = stability(fwd_runs, bwd_runs, cap.op_ids)
    return ProfileInfo(
        device_type=type_name, threads=torch.get_num_threads(), torch_version=torch.__version__,
        repeats=len(steps), warmup=warmup, step_ms=round(step_ms, 4), op_sum_ms=round(op_sum_ms, 4),
        peak_memory_bytes=int(peak_bytes), scaling_batch_size=scaling_batch_size,
        allocator=allocator, **overhead,
        thread_counts=tuple(sorted({torch.get_num_threads(), *at_threads})) if at_threads else (),
        op_sum_spread=round(spread.sum_spread, 4), step_spread=round(relative_iqr(steps), 4),
        op_spread=round(spread.op_spread, 4), noisy_share=round(spread.noisy_share, 4),
        note=(f"op sum / step = {op_sum_ms / step_ms:.3f} (medians), "
              f"{min(round_sums) / min(steps):.3f} (fastest round of each), "
              f"{_per_round(round_sums)}; loss outside the graph {loss_ms:.2f} ms; {note_tail}"))


def _rounds(cap, clock, module, inputs, loss_fn, plain_step, smaller, timed, repeats: int,
            span_s: float, dev, tick):
    """Module doc, steps 4 and 5: rounds of a whole step, an instrumented step (into
    ``timed``) and (with ``smaller``) one at the smaller batch, ``repeats``, more until they
    span ``span_s`` seconds, and more while ``stability`` is not reached. Returns the step
    seconds and the CUDA peak of the first step (None on a CPU)."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    steps = []
    peak = None
    for r in round_indices(repeats, lambda: stability(timed.fwd_runs, timed.bwd_runs,
                                                       cap.op_ids).stable, span_s=span_s):
        more = (3 if smaller is not None else 2) if r >= repeats else 0  # beyond --repeats
        plain = plain_step()
        steps.append(sum(plain))
        tick("timing the whole step", more)
        if dev.type == "cuda" and len(steps) == 1:
            peak = torch.cuda.max_memory_allocated(dev)
        timed.round(clock, module, inputs, loss_fn, plain)
        tick("timing every op")
        if smaller is not None:  # right after the full batch's round, on the same machine state
            smaller.run(clock, module)
            tick(f"timing every op at batch {smaller.small}")
    return steps, peak


def _runtime_colocation(cap, workload, seed: int, dev: torch.device
                        ) -> tuple[tuple[tuple[str, ...], ...], str]:
    """The op groups the runtime can only place together (``probe.colocation_groups``), and
    a note for the profile: empty, or why there are none when the model does not run at
    the probe's small batches (the runtime, which probes the same way, cannot split such a
    model either)."""
    def make_inputs(rows: int):
        return tuple(t.to(dev) for t in workload.make_batch(rows, seed)[0])

    try:
        info = probe(cap.graph_module, make_inputs)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model at a small batch
        return (), (f"; no colocation groups: the model fails at {PROBE_ROWS} rows "
                    f"({type(exc).__name__}: {exc})")
    return colocation_groups(cap.graph_module, cap.op_of, info), ""


def input_gradient_flops(model: ModelRef, granularity: Granularity | str, *, seed: int = 0,
                         leaf_modules: Iterable[str] = ()) -> dict[str, float]:
    """Op id -> the backward FLOPs that compute input gradients (``Op.bwd_input_flops``), by
    the profile's second counting pass alone (on the CPU, no timing): for a graph profiled
    without them, at the same granularity, leaves and batch (FLOPs depend on nothing else)."""
    workload = zoo.instantiate(model, seed=seed)
    module = workload.module.train()
    inputs, target = workload.make_batch(model.batch_size, seed)
    cap = capture(module, inputs, granularity=Granularity(granularity),
                  leaf_modules=tuple(leaf_modules))
    counter = _input_gradient_pass(cap, module, inputs, lambda out: workload.loss(out, target),
                                   make_clock(torch.device("cpu")), model, CostCounter())
    return {op: float(counter.bwd_flops.get(op, 0.0)) for op in cap.op_ids}


def _input_gradient_pass(cap, module, inputs, loss_fn, clock, model, counter) -> CostCounter:
    """One more step under a fresh counter in which autograd computes only the gradients
    of the activations (``Recorder.run(input_grads_only=True)``): its backward FLOPs per
    op are those that compute input gradients, the part of a backward that a pipeline
    stage must finish before it sends gradients back (the weight gradients can wait)."""
    input_counter = CostCounter(counter.memory_limit_bytes)
    input_counter.track([*module.parameters(), *module.buffers(), *inputs])
    with _model_errors(model, cap):
        with input_counter:
            Recorder(cap, clock, input_counter).run(inputs, loss_fn, input_grads_only=True)
    module.zero_grad(set_to_none=True)
    return input_counter


def _overhead_note(per_event_ms: tuple[float, float], threads: int, taken_ms: float | None,
                   batch: int | None = None) -> str:
    per_f, per_b = per_event_ms
    at = f" at batch {batch}" if batch else ""
    clock = "thread CPU time" if threads == 1 else "wall clock"
    taken = f", {taken_ms:.2f} ms of the per-op sum" if taken_ms is not None else ""
    return (f"instrumentation{at} {per_f * 1e3:.1f} us per forward node, {per_b * 1e3:.1f} us "
            f"per backward node (fastest rounds at {threads} thread(s), {clock}) taken off "
            f"the ops{taken}; ")


def _overhead_field(per_event, per_event_small, taken_ms: float) -> dict:
    """``ProfileInfo``'s record of the instrumentation taken off (µs per event, ms in all)."""
    us = {"fwd": per_event[0] * 1e3, "bwd": per_event[1] * 1e3}
    if per_event_small is not None:
        us |= {"fwd_small": per_event_small[0] * 1e3, "bwd_small": per_event_small[1] * 1e3}
    return {"instrumentation_us": {k: round(v, 3) for k, v in us.items()},
            "instrumentation_taken_ms": round(taken_ms, 4)}


def _round_sums_s(fwd_runs: dict, bwd_runs: dict, ops: list[str]) -> list[float]:
    """Per timed round, the seconds of every op's forward and backward, summed."""
    rounds = max((len(v) for v in fwd_runs.values()), default=0)
    return [sum(fwd_runs[o][k] + bwd_runs[o][k] for o in ops) for k in range(rounds)]


def _per_round(sums_s: list[float]) -> str:
    return f"op sum per round {min(sums_s) * 1e3:.1f}-{max(sums_s) * 1e3:.1f} ms"


def _settle_only(steps: list[float], threads: int, smaller) -> bool:
    """Whether the thread pass at ``threads`` runs one plain step, to settle its threads,
    instead of one per round: where its step (the rounds' fastest, scaled by the thread
    counts: an upper bound) is longer than ``SETTLE_ONLY_S`` and the smaller batch's
    rounds, which give the instrumentation's cost per event, run."""
    if smaller is None or smaller.failed:
        return False
    return min(steps) * max(1.0, torch.get_num_threads() / threads) > SETTLE_ONLY_S


def _thread_pass(threads: int, cap, clock, module, inputs, loss_fn, plain_step, repeats: int,
                 span_s: float, tick, workload, small: int, seed: int, dev, cpus, *, plain_rounds: bool = True):
    """Every op timed at ``threads`` intra-op threads, pinned as a worker of that many
    (module doc, step 6): rounds as at the profile's own threads, by the same rule, each
    followed (``small``: batch > 1) by one at the smaller batch; a round's plain step
    settles the thread pool for its instrumented one (the first plain step, cold, is never
    the fastest that the instrumentation's cost is taken against). Without
    ``plain_rounds``, one plain step settles them all (``TimedRounds.settled_s``) and the
    rounds have none. ``cpus`` are the process's CPUs before the profile pinned it (the
    main pass may hold fewer than ``threads``). Returns the rounds (``TimedRounds``) and the
    smaller batch's (``_SmallBatchRounds`` or None); the threads and the pinning are
    restored."""
    main = torch.get_num_threads()
    torch.set_num_threads(threads)
    pin(threads, cpus)
    timed = TimedRounds(cap)
    smaller = _SmallBatchRounds(cap, workload, small, seed, dev) if small else None
    try:
        if not plain_rounds:
            timed.settled_s = sum(plain_step())
        for r in round_indices(repeats, lambda: stability(timed.fwd_runs, timed.bwd_runs,
                                                           cap.op_ids).stable, span_s=span_s):
            timed.round(clock, module, inputs, loss_fn,
                        plain_step() if plain_rounds else None, with_plain=plain_rounds)
            if smaller is not None:
                smaller.run(clock, module)
            tick(f"timing every op at {threads} thread(s)", 1 if r >= repeats else 0)
    finally:
        torch.set_num_threads(main)
        pin(main, cpus)
    return timed, smaller


def _one_thread_step_s(steps: list[float], passes: dict) -> float:
    """The fastest plain step at one thread (seconds): from the one-thread pass (its
    rounds' plain steps, or the one that settled it), or the rounds' own steps at one
    thread, else those times the threads (an upper bound)."""
    if 1 in passes and passes[1][0].plain:
        return min(sum(p) for p in passes[1][0].plain)
    if 1 in passes and passes[1][0].settled_s is not None:
        return passes[1][0].settled_s
    return min(steps) * torch.get_num_threads()


def _pass_result(timed, smaller, batch_size: int, per_event_ms, op_ids
                 ) -> tuple[dict[str, float], dict[str, float], float, dict]:
    """A thread pass's per-op median forward and backward ms (less the instrumentation:
    ``per_event_ms`` at the full and at the smaller batch), the spread of its round sums and
    the ops' fixed parts (empty without ``smaller``)."""
    full, small = per_event_ms
    fwd, bwd = timed.medians_ms(full)
    fixed = smaller.fixed_parts(batch_size, fwd, bwd, small)[0] if smaller else {}
    return ({o: fwd[o] for o in op_ids}, {o: bwd[o] for o in op_ids},
            stability(timed.fwd_runs, timed.bwd_runs, op_ids).sum_spread, fixed)


def _with_thread_times(ops, at_threads: dict) -> tuple:
    """``ops`` with their times at the other thread counts (``Op.fwd_ms_by_threads``)."""
    if not at_threads:
        return tuple(ops)
    out = []
    for op in ops:
        if not op.fwd_ms:  # an op the profile does not time (an input)
            out.append(op)
            continue
        fwd = {str(n): round(f[op.id], 6) for n, (f, _, _, _) in sorted(at_threads.items())}
        bwd = {str(n): round(b[op.id], 6) for n, (_, b, _, _) in sorted(at_threads.items())}
        fixed = {str(n): fx[op.id] for n, (_, _, _, fx) in sorted(at_threads.items())
                 if op.id in fx}
        out.append(replace(
            op, fwd_ms_by_threads=fwd, bwd_ms_by_threads=bwd if op.bwd_ms else {},
            fwd_fixed_ms_by_threads={n: round(min(f, fwd[n]), 6) for n, (f, _) in fixed.items()},
            bwd_fixed_ms_by_threads={n: round(min(b, bwd[n]), 6) for n, (_, b) in fixed.items()}
            if op.bwd_ms else {}))
    return tuple(out)


def _threads_note(at_threads: dict, op_sum_ms: float) -> str:
    parts = [f"{sum(f.values()) + sum(b.values()):.1f} ms (spread {spread:.1%}) at {n} thread(s)"
             for n, (f, b, spread, _) in sorted(at_threads.items())]
    return f"op sum {op_sum_ms:.1f} ms at {torch.get_num_threads()} thread(s), " + ", ".join(
        parts) + "; " if parts else ""


def fixed_part(t_ms: float, t_small_ms: float, fraction: float) -> float:
    """The batch-independent part ``fixed`` of ``t(f) = fixed + (t - fixed) f``, given the
    time ``t_ms`` at the full batch and ``t_small_ms`` at ``fraction`` of it; in ``[0, t]``."""
    return min(t_ms, max(0.0, (t_small_ms - t_ms * fraction) / (1 - fraction)))


class _SmallBatchRounds:
    """Instrumented steps at batch ``small``, one after each full-batch round (module doc,
    step 5), and the per-op parts that do not shrink with the batch that they give.

    A model that cannot run at the smaller batch stops them (``failed``) and gets no
    fixed parts."""

    def __init__(self, cap: Capture, workload, small: int, seed: int, dev: torch.device):
        self.cap, self.workload, self.small = cap, workload, small
        inputs, target = workload.make_batch(small, seed)
        self.inputs = tuple(t.to(dev) for t in inputs)
        self.target = None if target is None else target.to(dev)
        self.timed = TimedRounds(cap)
        self.settling: list[tuple[float, float]] = []  # per round: the settling plain step
        self.failed = ""

    def run(self, clock, module) -> None:
        """A plain step and an instrumented step at the smaller batch."""
        if self.failed:
            return
        try:
            loss = lambda output: self.workload.loss(output, self.target)  # noqa: E731
            settling = time_plain_step(module, self.inputs, loss, clock)  # module doc, step 5
            self.timed.round(clock, module, self.inputs, loss)
            self.settling.append(settling)
        except Exception as exc:  # a model whose trace only runs at its profiled batch
            self.failed = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        finally:
            module.zero_grad(set_to_none=True)

    def cold_ms(self) -> tuple[float | None, float | None]:
        """What the first step at the smaller batch after the full batch's costs more than the
        one right after it (forward, backward ms; median over rounds, at least 0), or None."""
        pairs = list(zip(self.settling, self.timed.plain))
        if self.failed or not pairs:
            return None, None
        return tuple(round(max(0.0, statistics.median(s[k] - p[k] for s, p in pairs)) * 1e3, 4)
                     for k in (0, 1))

    def fixed_parts(self, batch_size: int, fwd_ms: dict, bwd_ms: dict,
                    per_event_ms: tuple[float, float]) -> tuple[dict, str]:
        """``({op: (fwd_fixed, bwd_fixed)}, note)`` from the medians of the rounds."""
        if self.failed:
            return {}, f"fixed parts not measured (batch {self.small} failed: {self.failed}); "
        f = self.small / batch_size
        ops = self.cap.op_ids
        small_ms = self.timed.medians_ms(per_event_ms)
        fixed = {op: tuple(fixed_part(full[op], small[op], f)
                           for small, full in zip(small_ms, (fwd_ms, bwd_ms), strict=True))
                 for op in ops}
        at_full = sum(fwd_ms[o] + bwd_ms[o] for o in ops)
        share = sum(a + b for a, b in fixed.values()) / at_full if at_full > 0 else 0.0
        sums = _round_sums_s(self.timed.fwd_runs, self.timed.bwd_runs, ops)
        spread = f", {_per_round(sums)}" if sums else ""
        return fixed, (f"batch-independent part {share:.0%} of the per-op sum (from batch "
                       f"{self.small}{spread}); ")


class _model_errors:
    """Turn an exception raised while running the model into a ``BadInput`` naming where."""

    def __init__(self, model: ModelRef, cap: Capture):
        self.model = model
        self.cap = cap

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or not isinstance(exc, Exception):
            return False
        shapes = ", ".join(f"{list(s.shape)} {s.dtype}" for s in self.model.inputs)
        if isinstance(exc, MemoryLimitExceeded) or isinstance(exc, torch.cuda.OutOfMemoryError):
            raise BadInput(f"model {self.model.name!r} on inputs {shapes} does not fit in memory "
                           f"({(str(exc).strip().splitlines() or [''])[0][:160]}); try a smaller "
                           f"--batch-size or --seq-len") from None
        if isinstance(exc, DlNfvError):
            return False
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        where = _where(exc.__traceback__, self.cap)
        raise BadInput(f"model {self.model.name!r} failed on inputs {shapes}: "
                       f"{type(exc).__name__}: {reason}{where}") from None


def _where(tb, cap: Capture) -> str:
    """' (in op X, module Y)' from the innermost interpreter frame of a traceback, if any."""
    node = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "run_node" and "n" in frame.f_locals:
            node = frame.f_locals["n"]
        tb = tb.tb_next
    if node is None or getattr(node, "name", None) not in cap.op_of:
        return ""
    op = cap.op_of[node.name]
    modules = cap.modules_of.get(op) or ()
    return f" (in op {op!r}" + (f", module {modules[0]!r})" if modules else ")")
