"""A worker's whole run: load, join the process group, build, step, measure, report.

``run_worker`` is what ``python -m dl_nfv.runtime.worker`` executes on every
rank. Measurement: each step's wall time on each rank (batch creation
excluded, CUDA synchronised at both ends), the part of it spent waiting in
communication (``Comm.wait_ms``), and the process's peak memory. Rank 0
gathers every rank's figures and writes the ``run-report``.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dl_nfv.artifacts import BadInput, save
from dl_nfv.artifacts.devices import DeviceKind
from dl_nfv.profilers.allocator import ENV as ALLOCATOR_ENV
from dl_nfv.profilers.allocator import keep_freed_memory

from .comm import Comm, defer_transport_threads
from .executor import PlanExecutor, RankContext
from .inputs import (
    cpu_set,
    default_warmup,
    device_kinds,
    device_threads,
    load_inputs,
    trace_path_of,
)
from .model import build_workload, synthetic_batches, to_device, user_batches
from .report import build_report
from .sfb import sent_bytes
from .timeline import CATEGORIES
from .worker import WorkerOptions

TRACE_STEPS = 3


def choose_backend(requested: str, kinds: set[str], *, cuda_available: bool, cuda_devices: int,
                   local_world: int) -> str:
    """``gloo`` or ``nccl``: NCCL when asked, or (auto) when the plan's devices are GPUs (or
    unknown) and this host has a CUDA device per local rank; gloo otherwise."""
    if requested == "gloo":
        return "gloo"
    if requested == "nccl":
        if not cuda_available:
            raise BadInput("--backend nccl needs CUDA, which this machine does not have")
        if cuda_devices < local_world:
            raise BadInput(f"--backend nccl: {local_world} local ranks but {cuda_devices} CUDA devices")
        return "nccl"
    gpu_plan = not kinds or DeviceKind.GPU.value in kinds
    return "nccl" if cuda_available and cuda_devices >= local_world and gpu_plan else "gloo"


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def pin_threads(topology, devices, requested: int | None, rank: int, local_rank: int,
                local_world: int) -> tuple[int, tuple[int, ...]]:
    """Give this worker its device's cores, before any thread pool or process group starts.

    Threads (intra-op and inter-op) as ``device_threads`` says: ``--threads``, else the
    device's cores by the topology. The process is pinned to its own block of this host's
    allowed CPUs (``cpu_set``: the host's local ranks side by side) where they all fit, as
    the device would be; otherwise it shares the host's CPUs. Returns the threads and the
    CPUs pinned to (empty: not pinned).
    """
    first = rank - local_rank  # the host's local ranks are first .. first + local_world - 1
    local_devices = devices[first:first + local_world]
    threads_of = device_threads(topology, local_devices, requested, local_world)
    threads = threads_of[local_rank]
    cpus: tuple[int, ...] = ()
    if hasattr(os, "sched_getaffinity"):
        cpus = cpu_set(threads_of, local_rank, sorted(os.sched_getaffinity(0)))
        if cpus:
            os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # inter-op work already started in this process (a forked worker)
        pass
    return threads, cpus


def run_worker(options: WorkerOptions, *, rank: int, on_device: Callable[[str], None]) -> None:
    keep_freed_memory()  # before anything is allocated, as the profiler does
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    plan, graph, topology, _ = load_inputs(options.plan, options.graph, options.topology)
    devices = plan.devices
    if world != len(devices):
        raise BadInput(f"WORLD_SIZE is {world} but the plan uses {len(devices)} devices "
                       f"({', '.join(devices)}); start one process per plan device")
    me = devices[rank]
    on_device(me)
    if options.steps < 1:
        raise BadInput(f"--steps must be >= 1, got {options.steps}")
    warmup = default_warmup(options.steps) if options.warmup is None else options.warmup
    if not 0 <= warmup < options.steps:
        raise BadInput(f"--warmup must be in [0, {options.steps}), got {warmup}")
    _, cpus = pin_threads(topology, devices, options.threads, rank, local_rank, local_world)
    kinds = device_kinds(topology, devices)
    backend = choose_backend(options.backend, set(kinds.values()),
                             cuda_available=torch.cuda.is_available(),
                             cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
                             local_world=local_world)
    if backend == "nccl":
        torch_device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(torch_device)
    else:
        torch_device = torch.device("cpu")
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=options.timeout_s))
    try:
        _run(options, plan, graph, topology, rank, world, me, cpus, warmup, backend, torch_device)
    except BaseException:
        raise  # leave the group as is: its peers learn of the failure from the launcher
    else:
        dist.destroy_process_group()


def _run(options, plan, graph, topology, rank, world, me, cpus, warmup, backend, torch_device):
    cuda = torch_device.type == "cuda"
    comm = Comm(rank, torch_device, synchronize=cuda)
    rank_of = {d: i for i, d in enumerate(plan.devices)}
    ctx = RankContext(rank=rank, world_size=world, device_name=me, torch_device=torch_device,
                      rank_of=rank_of, comm=comm)
    workload = build_workload(graph.model, options.seed)
    executor = PlanExecutor(plan, graph, workload, ctx, seed=options.seed, lr=options.lr)
    _check_same_model(workload.module, world)
    if options.data:
        batches = user_batches(options.data, plan.batch_size, options.seed)
    else:
        batches = synthetic_batches(workload, plan.batch_size, options.seed)
    run_dir = options.run_dir or os.environ.get("DL_NFV_RUN_DIR")
    iteration_ms: list[float] = []
    wait_ms: list[float] = []
    cpu_ms: list[float] = []
    losses: list[float] = []
    breakdown: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    spans: dict[int, tuple[float, list]] = {}  # measured step -> (its start, its spans)
    profiler = None
    trace_file = None
    if backend == "gloo":  # every group of the plan exists by now (PlanExecutor made them)
        defer_transport_threads()
    comm.take_wait_ms()
    for step in range(options.steps):
        inputs, target = next(batches)
        inputs, target = to_device(tuple(inputs), torch_device), to_device(target, torch_device)
        if options.trace and step == warmup:
            profiler = _start_profiler(cuda)
        if cuda:
            torch.cuda.synchronize(torch_device)
        t0, c0 = time.perf_counter(), time.process_time()
        comm.timeline.begin(t0)
        loss = executor.step(inputs, target)
        if cuda:
            torch.cuda.synchronize(torch_device)
        iteration_ms.append((time.perf_counter() - t0) * 1e3)
        for category, ms in comm.timeline.finish(iteration_ms[-1]).items():
            breakdown[category].append(ms)
        if step >= warmup:
            spans[step] = (t0 * 1e3, comm.timeline.spans)
        cpu_ms.append((time.process_time() - c0) * 1e3)
        wait_ms.append(comm.take_wait_ms())
        losses.append(loss)
        if profiler is not None and step == min(warmup + TRACE_STEPS, options.steps) - 1:
            profiler.__exit__(None, None, None)
            trace_file = trace_path_of(options.trace, rank)
            profiler.export_chrome_trace(str(trace_file))
            profiler = None
        if step == 0 and run_dir:
            Path(run_dir, f"rank{rank}.running").touch()
    total = torch.tensor(losses, dtype=torch.float64, device=torch_device)
    dist.all_reduce(total)
    measured = slice(warmup, options.steps)
    result = {
        "rank": rank, "device": me, "host": os.uname().nodename,
        "iteration_ms": iteration_ms,
        "compute_ms": statistics.median(t - w for t, w in zip(iteration_ms[measured], wait_ms[measured])),
        "wait_ms": statistics.median(wait_ms[measured]),
        "cpu_ms": statistics.median(cpu_ms[measured]),
        "peak_memory_bytes": peak_memory_bytes(torch_device),
        "op_ms": {ph: {op: statistics.median(ts[warmup:] or ts) for op, ts in times.items()}
                  for ph, times in executor.op_times_ms().items()},
        "device_type": _device_type(topology, me),
        "threads": torch.get_num_threads(), "cpus": list(cpus),
        "breakdown_ms": breakdown, "spans": spans, "sent_bytes": sent_bytes(executor.syncs),
    }
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    if options.save_params:
        torch.save(executor.held_parameters(), Path(options.save_params) / f"rank{rank}.pt")
    if rank == 0 and options.output:
        notes = _thread_notes(graph, gathered)
        allocator = keep_freed_memory()  # the policy in force (applied once, at the start)
        if graph.profile is not None and graph.profile.allocator not in ("", allocator):
            notes.append(f"the graph was profiled with the {graph.profile.allocator!r} heap "
                         f"policy, the workers ran with {allocator!r} ({ALLOCATOR_ENV}): "
                         f"profile under the same policy to compare with the simulator")
        compressed = [g.id for g in plan.groups if g.compression.value != "none"
                      and g.id not in executor.sfb_groups]
        if compressed:
            notes.append(f"group(s) {', '.join(compressed)} plan gradient compression; the "
                         f"runtime sent their gradients uncompressed")
        notes.extend(executor.fused.notes)
        report = build_report(plan=plan, plan_path=options.plan, graph=graph, mode=executor.mode,
                              results=gathered, losses=[float(x) for x in total.cpu()],
                              backend=backend, steps=options.steps, warmup=warmup,
                              trace=options.trace or "", notes=notes)
        save(report, options.output)
    dist.barrier()


def _thread_notes(graph, results) -> list[str]:
    """Where the workers' threads differ from the profile's, and where they were not pinned."""
    from dl_nfv.simulator.extrapolation import measured_counts

    notes = []
    timed = measured_counts(graph.profile) if graph.profile is not None else ()
    for threads in sorted({r["threads"] for r in results}):
        if timed and threads not in timed:
            devices = [r["device"] for r in results if r["threads"] == threads]
            notes.append(f"the graph's ops were timed at {', '.join(map(str, timed))} thread(s), "
                         f"{', '.join(devices)} ran with {threads}: the simulator's op times "
                         f"for them are scaled from those (docs/cost-model.md, Threads)")
    loose = [r["device"] for r in results if not r["cpus"]]
    if loose:
        notes.append(f"{', '.join(loose)} not pinned to CPUs of their own: the workers' "
                     f"threads outnumber this host's CPUs")
    return notes


def _device_type(topology, device: str) -> str:
    if topology is None:
        return "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    from dl_nfv.artifacts import cluster_of

    return cluster_of(topology).device(device).type.name


def _check_same_model(module: torch.nn.Module, world: int) -> None:
    """Every rank must start from the same parameters (built from the same seed)."""
    from .model import parameter_checksum

    mine = parameter_checksum(module)
    sums = [None] * world
    dist.all_gather_object(sums, mine)
    if any(abs(s - sums[0]) > 1e-6 * max(1.0, abs(sums[0])) for s in sums):
        raise RuntimeError(f"ranks built different models (parameter checksums {sums})")


def _start_profiler(cuda: bool):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    prof.__enter__()
    return prof
