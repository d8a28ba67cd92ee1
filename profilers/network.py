"""``profile network``: measure the links between worker processes and write a topology.

Method
    N processes join one ``torch.distributed`` group (gloo on CPU, NCCL on
    CUDA; started here with ``spawn``, or by ``torchrun`` on many hosts). For
    every pair of ranks in turn (the others wait at a barrier) the lower rank
    sends a message of each size (1 KiB to 64 MiB by default, x4 steps) and the
    higher rank sends it back, in ``--repeats`` rounds: each round times every size once
    (5 messages of each size up to 1 MiB, which cost next to nothing, one of each larger),
    so a stretch in which other jobs hold the cores slows a round, not a size. The one-way
    time of a size is half the round trip of its fastest round (the round's lower quartile):
    other jobs only add time. (Under load, the median over all messages of a size took a
    1 KiB message from ~0.13 ms to 2-6 ms; the fastest round is what the link costs when
    both ends run.) The report keeps the median round beside it: their ratio is how much
    other jobs disturbed the probe, and the topology's description states it.
    A fit of ``t(s) = latency + s / bandwidth`` per pair (the slope over the
    larger half of the sizes, the latency the median left over the smaller half) gives
    ``latency_us`` and ``bandwidth_gbps``. With gloo on CPUs each rank also reads its
    process's CPU time (all its threads: gloo's too) around every round trip, half of it
    per message (one sent, one received); per size the least over the messages (other jobs
    only add CPU time), of the busier end, fitted the same way, gives the interconnect's
    ``message_cpu_us`` and ``message_cpu_us_per_mib`` (``fits.message_cpu``).
    Then every rank runs AllReduce over the same sizes in rounds the same way (the time of
    one is the slowest rank's; per size the fastest round), reported with its bus bandwidth
    ``2(N-1)/N * S / t``. On
    CPU each process also times an FP32 matmul, recorded as the device's
    ``fp32_tflops`` override, and, all processes at once (as training workers
    run), an in-place add over 256 MiB tensors (three passes: read two, write
    one), recorded as its ``memory_bandwidth_gb_per_s`` override: the rate at
    which optimizer steps, gradient buckets and gloo's sums move memory. Both keep
    the fastest of repeated timings (the median of 256 MiB adds gave
    2-32 GB/s on one machine as its load changed); the adds start together, after a
    barrier, each time (a process adding alone has the bandwidth to itself).

Topology written
    Ranks are grouped by host name. On each host the processes are devices of
    type ``cpu`` (memory: the host's RAM shared evenly; FP32 peak: measured) or
    of their GPU's catalog type, joined by an ``interconnect`` (``loopback``
    for CPU processes, ``nvlink`` for GPUs with peer access, else ``pcie``)
    with the median measured figures of the host's pairs, plus an explicit
    link per pair when a host has three or more processes. The host-bridge
    link gets the same figures, so routes take the measured path. Hosts
    connect through NICs to one switch; a NIC gets the measured cross-host
    bandwidth and half of the latency that the host links do not account for.
    On one host without per-pair links the interconnect also gets the figures
    a collective sees (``collective_latency_us``, ``collective_bandwidth_gbps``): the measured
    AllReduce is fitted like a pair (``fit_link``), and the cost model's AllReduce
    over every probed device, affine in size, is scaled to that line, its latency
    by the ratio of the two latencies and its link term (what is left after the
    CPU's sums) by the ratio of the two slopes. A collective library pays more per
    step than one transfer: with gloo on loopback, a 2-process AllReduce took
    2-2.7x what the pair's figures give at 1-64 KiB and 1.2-1.35x at 16-64 MiB.

Limits: one message in flight per pair (no concurrency between pairs), the
fit is a single latency/bandwidth line (no protocol switching), a
multi-host fabric is summarised as one switch, and collectives across hosts
keep the links' point-to-point figures (the AllReduce measured there mixes
both kinds of link).
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dl_nfv.artifacts import BadInput, RuntimeFailure, Topology, from_data

from .allocator import keep_freed_memory, requested_policy
from .fits import LinkFit, fit_affine, fit_link, message_cpu  # noqa: F401 (re-exported)
from .network_rounds import AGREE, allreduce_rounds, fastest_round, pair_rounds

DEFAULT_SIZES = tuple(1024 * 4**i for i in range(9))  # 1 KiB .. 64 MiB
# Messages up to SMALL_BYTES are timed SMALL_FACTOR times as often: they cost next to
# nothing, and on a shared machine a few-ms stall now and then (the scheduler, gloo's
# wake-ups) took the median of 5 small messages from 0.1 ms to 2 ms in one probe.
SMALL_BYTES = 2**20
SMALL_FACTOR = 5
GIB = 2**30


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """Sizes from ``min_bytes`` growing ``factor``-fold up to ``max_bytes``; at least two."""
    if min_bytes < 4 or max_bytes < factor * min_bytes:
        raise BadInput(f"--min-bytes {min_bytes} / --max-bytes {max_bytes}: need min >= 4 and "
                       f"max >= {factor} x min (at least two sizes)")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


@dataclass
class NetworkReport:
    """Raw measurements: per pair and size the one-way seconds; AllReduce seconds per size."""

    backend: str
    world_size: int
    hosts: list[str]
    devices: list[str]
    sizes: list[int]
    p2p_s: dict[str, list[float]] = field(default_factory=dict)  # "i-j" -> per size
    # "i-j" -> per size, the CPU seconds per message of the busier end (gloo on CPUs)
    p2p_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    allreduce_s: list[float] = field(default_factory=list)
    fits: dict[str, dict[str, float]] = field(default_factory=dict)
    matmul_gflops: list[float] = field(default_factory=list)
    memory_gb_per_s: list[float] = field(default_factory=list)
    memory_gib: dict[str, float] = field(default_factory=dict)
    # the intra-op threads of every worker where ``--threads`` asked for them (0: torch's
    # share of the host's cores): the topology's CPU devices get that many ``cores``
    threads: int = 0
    rounds: int = 0  # the most rounds a measurement took (0: a report without rounds)
    # per pair and size, and per size, the median of the rounds (the estimate is the fastest)
    p2p_median_round_s: dict[str, list[float]] = field(default_factory=dict)
    allreduce_median_round_s: list[float] = field(default_factory=list)

    def to_data(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size, "hosts": self.hosts,
                "devices": self.devices, "sizes_bytes": self.sizes, "p2p_one_way_s": self.p2p_s,
                "p2p_cpu_per_message_s": self.p2p_cpu_s,
                "allreduce_s": self.allreduce_s, "fits": self.fits,
                "matmul_gflops": self.matmul_gflops, "memory_gb_per_s": self.memory_gb_per_s,
                "memory_gib": self.memory_gib, "threads": self.threads, "rounds": self.rounds,
                "p2p_median_round_s": self.p2p_median_round_s,
                "allreduce_median_round_s": self.allreduce_median_round_s}

    def allreduce_bus_gbps(self, index: int = -1) -> float:
        n = self.world_size
        size, sec = self.sizes[index], self.allreduce_s[index]
        return 2 * (n - 1) / n * size * 8 / sec / 1e9 if n > 1 and sec > 0 else 0.0


# ------------------------------------------------------------------------- worker side
@dataclass(frozen=True)
class ProbeConfig:
    """What the workers time: ``repeats`` rounds over ``sizes`` (``per_round`` messages of
    each size a round), after ``warmup`` untimed messages per size; ``clock`` and
    ``cpu_clock`` read wall and process CPU seconds (``time.perf_counter``,
    ``time.process_time``: a test may wrap them, in a picklable callable); up to
    ``max_rounds`` rounds while they have not settled (``network_rounds.more_rounds``)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 5
    warmup: int = 2
    backend: str = "gloo"
    threads: int = 1
    timeout_s: float = 300.0
    clock: Callable[[], float] = time.perf_counter
    cpu_clock: Callable[[], float] = time.process_time
    max_rounds_factor: int = 4  # rounds added while unsettled, up to this many x repeats

    @property
    def max_rounds(self) -> int:
        return self.repeats * self.max_rounds_factor

    def per_round(self, size: int) -> int:
        """How many messages of ``size`` a round times (their median is the round's)."""
        return SMALL_FACTOR if size <= SMALL_BYTES else 1


def run_probe(rank: int, world: int, config: ProbeConfig, progress: Callable | None = None):
    """Measure, inside an initialised process group; returns the report on rank 0, else None."""
    import torch
    import torch.distributed as dist

    keep_freed_memory()
    hostname = socket.gethostname()
    names: list = [None] * world
    dist.all_gather_object(names, hostname)
    local_rank = names[:rank].count(hostname)
    if config.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        from dl_nfv.runtime.comm import defer_transport_threads  # as the workers run them

        device = torch.device("cpu")
        torch.set_num_threads(config.threads)
        defer_transport_threads()
    pairs = [(i, j) for i in range(world) for j in range(i + 1, world)]
    steps = len(pairs) + 2
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None and rank == 0:
            progress(what, done, steps)

    buffers = {s: torch.ones(max(1, s // 4), dtype=torch.float32, device=device) for s in config.sizes}
    p2p: dict[str, list[list[float]]] = {}  # per pair, per size, the median of each round
    cpu: dict[str, list[float]] = {}  # this rank's CPU seconds per message, per pair and size
    for i, j in pairs:
        if rank in (i, j):
            rounds, cpu_times = pair_rounds(rank, i, j, buffers, config, device)
            if rank == i:
                p2p[f"{i}-{j}"] = rounds
            cpu[f"{i}-{j}"] = cpu_times
        dist.barrier()
        tick(f"pair {i}-{j}")
    allreduce = allreduce_rounds(buffers, config, device)
    tick("allreduce")

    gflops = _matmul_gflops(device) if device.type == "cpu" else 0.0
    dist.barrier()
    memory = _memory_gb_per_s(device, dist.barrier) if device.type == "cpu" else 0.0
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"p2p": p2p, "gflops": gflops, "memory": memory,
                                      "cpu": cpu if device.type == "cpu" else {},
                                      "device": _device_label(device)})
    tick("gathering")
    if rank != 0:
        return None
    report = NetworkReport(backend=config.backend, world_size=world, hosts=names,
                           devices=[g["device"] for g in gathered], sizes=list(config.sizes),
                           allreduce_s=[fastest_round(r)[0] for r in allreduce],
                           allreduce_median_round_s=[fastest_round(r)[1] for r in allreduce],
                           matmul_gflops=[g["gflops"] for g in gathered],
                           memory_gb_per_s=[g["memory"] for g in gathered], rounds=len(allreduce[0]))
    for g in gathered:
        for key, per_size in g["p2p"].items():
            report.rounds = max(report.rounds, len(per_size[0]))
            report.p2p_s[key] = [fastest_round(r)[0] for r in per_size]
            report.p2p_median_round_s[key] = [fastest_round(r)[1] for r in per_size]
        for key, per_size in g["cpu"].items():  # the busier end of the pair
            have = report.p2p_cpu_s.get(key, per_size)
            report.p2p_cpu_s[key] = [max(a, b) for a, b in zip(have, per_size, strict=True)]
    order = sorted(report.p2p_s, key=lambda k: tuple(map(int, k.split("-"))))
    report.p2p_s = {k: report.p2p_s[k] for k in order}
    report.p2p_median_round_s = {k: report.p2p_median_round_s[k] for k in order}
    for key, times in report.p2p_s.items():
        fit = fit_link(config.sizes, times)
        report.fits[key] = {"latency_us": round(fit.latency_us, 3),
                            "bandwidth_gbps": round(fit.bandwidth_gbps, 4)}
    report.memory_gib = {h: _host_memory_gib() for h in dict.fromkeys(names)}
    return report


def _device_label(device) -> str:
    import torch

    if device.type == "cuda":
        from .devices import catalog_name_of_cuda

        peers = all(torch.cuda.can_device_access_peer(device.index, k)
                    for k in range(torch.cuda.device_count()) if k != device.index)
        return f"{catalog_name_of_cuda(device)}{'+p2p' if peers else ''}"
    return "cpu"


def _matmul_gflops(device, n: int = 512, budget_s: float = 0.3) -> float:
    """GFLOP/s of an ``n x n`` FP32 matmul: its fastest of repeated timings (other jobs
    only add time; each takes a few ms, so some run undisturbed on a busy machine)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    return 2 * n**3 / _fastest(lambda: a @ b, budget_s) / 1e9


def _memory_gb_per_s(device, together: Callable[[], object], nbytes: int = 256 * 2**20,
                     samples: int = 12) -> float:
    """GB/s moved by ``a += b`` over ``nbytes`` tensors (3 passes, beyond the caches), the
    fastest of ``samples`` timings, every process starting each one at once (``together``:
    a barrier), so that the fastest is one in which they shared the memory bandwidth."""
    import torch

    a = torch.ones(nbytes // 4, device=device)
    b = torch.ones(nbytes // 4, device=device)
    a.add_(b)
    best = float("inf")
    for _ in range(samples):
        together()
        t = time.perf_counter()
        a.add_(b)
        best = min(best, time.perf_counter() - t)
    return 3 * nbytes / best / 1e9


def _fastest(work: Callable[[], object], budget_s: float, least: int = 3) -> float:
    """The least wall seconds of ``work`` over repeated runs for ``budget_s`` (at least
    ``least`` runs)."""
    best, count, t0 = float("inf"), 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s or count < least:
        t = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t)
        count += 1
    return best


def _host_memory_gib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 16.0


def _spawned_worker(rank: int, world: int, port: int, config: ProbeConfig, queue) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group(config.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=config.timeout_s))
        report = run_probe(rank, world, config,
                           progress=lambda what, d, n: queue.put(("progress", what, d, n)))
        if rank == 0:
            queue.put(("result", report.to_data()))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises RuntimeFailure
        queue.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def choose_backend(backend: str, nprocs: int) -> str:
    import torch

    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "gloo"
    if backend not in ("gloo", "nccl"):
        raise BadInput(f"--backend {backend!r}: expected auto, gloo or nccl")
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < nprocs):
        raise BadInput(f"--backend nccl needs {nprocs} CUDA devices on this host")
    return backend


def probe_network(nprocs: int = 2, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5,
                  warmup: int = 2, backend: str = "auto", threads: int | None = None,
                  name: str | None = None, progress: Callable | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  cpu_clock: Callable[[], float] = time.process_time,
                  max_rounds_factor: int = 4,
                  ) -> tuple[Topology | None, NetworkReport | None]:
    """Measure the network between worker processes; ``(topology, report)`` (see module doc).

    Started by ``torchrun`` (``RANK``/``WORLD_SIZE`` set), this process is one
    rank and ``nprocs`` is ignored; only rank 0 returns results, the others
    ``(None, None)``. Otherwise it spawns ``nprocs`` local processes. ``clock``,
    ``cpu_clock`` and ``max_rounds_factor``: the spawned workers' (``ProbeConfig``).

    Raises ``BadInput`` for impossible settings and ``RuntimeFailure`` when a
    worker fails (its error is in the message). Cost: ``(pairs + 1) x sizes x
    (warmup + repeats)`` messages, where pairs = N(N-1)/2 (``SMALL_FACTOR`` times the
    repeats for messages up to ``SMALL_BYTES``); ``repeats`` is the number of rounds.
    """
    if repeats < 1 or warmup < 0:
        raise BadInput(f"--repeats must be >= 1 and --warmup >= 0, got {repeats} and {warmup}")
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if len(sizes) < 2 or sizes[0] < 4:
        raise BadInput("give at least two message sizes of 4 bytes or more")
    requested_policy()  # a bad DL_NFV_ALLOCATOR fails here, before any worker starts
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(sizes, repeats, warmup, backend, threads, name, progress)
    if nprocs < 2:
        raise BadInput(f"--nprocs must be >= 2 (links need two ends), got {nprocs}")
    chosen = choose_backend(backend, nprocs)
    cpus = os.cpu_count() or 1
    config = ProbeConfig(sizes=sizes, repeats=repeats, warmup=warmup, backend=chosen,
                         threads=threads or max(1, cpus // nprocs), clock=clock,
                         cpu_clock=cpu_clock, max_rounds_factor=max_rounds_factor)
    data = _spawn(nprocs, config, progress)
    report = NetworkReport(backend=data["backend"], world_size=data["world_size"],
                           hosts=data["hosts"], devices=data["devices"], sizes=data["sizes_bytes"],
                           p2p_s=data["p2p_one_way_s"], allreduce_s=data["allreduce_s"],
                           p2p_cpu_s=data.get("p2p_cpu_per_message_s", {}),
                           fits=data["fits"], matmul_gflops=data["matmul_gflops"],
                           memory_gb_per_s=data.get("memory_gb_per_s", []),
                           memory_gib=data["memory_gib"], threads=threads or 0,
                           rounds=data.get("rounds", 0),
                           p2p_median_round_s=data.get("p2p_median_round_s", {}),
                           allreduce_median_round_s=data.get("allreduce_median_round_s", []))
    return topology_from_report(report, name=name), report


def _under_torchrun(sizes, repeats, warmup, backend, threads, name, progress):
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = choose_backend(backend, local_world)
    config = ProbeConfig(sizes=sizes, repeats=repeats, warmup=warmup, backend=chosen,
                         threads=threads or max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(chosen, init_method="env://")
    try:
        report = run_probe(rank, world, config, progress=progress)
    finally:
        dist.destroy_process_group()
    if report is None:
        return None, None
    report.threads = threads or 0
    return topology_from_report(report, name=name), report


def _spawn(nprocs: int, config: ProbeConfig, progress: Callable | None) -> dict:
    import queue as queue_module

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_spawned_worker, args=(r, nprocs, port, config, queue), daemon=True)
             for r in range(nprocs)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + config.timeout_s + 60
    result = None
    try:
        while result is None:
            try:
                message = queue.get(timeout=0.5)
            except queue_module.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeFailure(f"network probe worker {dead[0][0]} exited with code "
                                         f"{dead[0][1]} before reporting") from None
                if time.monotonic() > deadline:
                    raise RuntimeFailure("network probe timed out") from None
                continue
            if message[0] == "progress" and progress is not None:
                progress(*message[1:])
            elif message[0] == "error":
                raise RuntimeFailure(f"network probe worker {message[1]} failed: {message[2]}")
            elif message[0] == "result":
                result = message[1]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return result


# ------------------------------------------------------------------------- topology
def _safe(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-")
    return cleaned or "host"


def topology_from_report(report: NetworkReport, name: str | None = None) -> Topology:
    """The ``topology`` record for a report (see the module docstring)."""
    hosts = list(dict.fromkeys(report.hosts))
    host_names = {h: _safe(h) for h in hosts}
    ranks_of = {h: [r for r, x in enumerate(report.hosts) if x == h] for h in hosts}
    fits = {tuple(map(int, k.split("-"))): v for k, v in report.fits.items()}

    def median_fit(pairs):
        got = [fits[p] for p in pairs if p in fits]
        if not got:
            return None
        return (statistics.median(f["bandwidth_gbps"] for f in got),
                statistics.median(f["latency_us"] for f in got))

    device_name: dict[int, str] = {}
    host_docs, link_docs = [], []
    intra_latency: dict[str, float] = {}
    for h in hosts:
        ranks = ranks_of[h]
        label = report.devices[ranks[0]]
        is_cpu = label == "cpu"
        prefix = "cpu" if is_cpu else "gpu"
        for k, r in enumerate(ranks):
            device_name[r] = f"{host_names[h]}/{prefix}{k}"
        spec: dict = {"type": "cpu" if is_cpu else label.removesuffix("+p2p"), "count": len(ranks)}
        if is_cpu:
            spec["memory_gib"] = round(report.memory_gib.get(h, 16.0) / len(ranks), 2)
            gflops = [report.matmul_gflops[r] for r in ranks if report.matmul_gflops[r] > 0]
            if gflops:
                spec["fp32_tflops"] = round(statistics.median(gflops) / 1e3, 4)
            memory = [report.memory_gb_per_s[r] for r in ranks
                      if r < len(report.memory_gb_per_s) and report.memory_gb_per_s[r] > 0]
            if memory:
                spec["memory_bandwidth_gb_per_s"] = round(statistics.median(memory), 2)
            if report.threads:  # each worker computed with this many threads: its device's cores
                spec["cores"] = report.threads
        doc: dict = {"name": host_names[h], "devices": [spec]}
        intra = median_fit([(a, b) for a in ranks for b in ranks if a < b])
        if intra is not None:
            bw, lat = round(intra[0], 4), round(intra[1], 3)
            kind = "loopback" if is_cpu else ("nvlink" if label.endswith("+p2p") else "pcie")
            doc["interconnect"] = {"kind": kind, "bandwidth_gbps": bw,
                                   "latency_us": lat / 2 if kind == "pcie" else lat}
            cpu_fits = [message_cpu(report.sizes, report.p2p_cpu_s[f"{a}-{b}"])
                        for a in ranks for b in ranks if f"{a}-{b}" in report.p2p_cpu_s]
            if is_cpu and cpu_fits:
                doc["interconnect"] |= {
                    "message_cpu_us": round(statistics.median(f[0] for f in cpu_fits), 3),
                    "message_cpu_us_per_mib": round(statistics.median(f[1] for f in cpu_fits), 3)}
            doc["host_link_gbps"] = bw
            doc["host_link_latency_us"] = lat / 2 if kind == "pcie" else lat
            intra_latency[h] = doc["host_link_latency_us"]
            if len(ranks) >= 3:
                for a in ranks:
                    for b in ranks:
                        if a < b and (a, b) in fits:
                            link_docs.append({"endpoints": [device_name[a], device_name[b]],
                                              "bandwidth_gbps": fits[(a, b)]["bandwidth_gbps"],
                                              "latency_us": fits[(a, b)]["latency_us"]})
        host_docs.append(doc)
    if len(hosts) > 1:
        cross = median_fit([p for p in fits if report.hosts[p[0]] != report.hosts[p[1]]])
        bw, lat = cross if cross is not None else (10.0, 50.0)
        for h, doc in zip(hosts, host_docs):
            host_lat = intra_latency.get(h, 1.0)
            nic_lat = max(0.0, (lat - 2 * host_lat) / 2)
            doc["nics"] = [{"switch": "net", "bandwidth_gbps": round(bw, 4),
                            "latency_us": round(nic_lat, 3)}]
    n = report.world_size
    big = report.sizes[-1]
    description = (f"Measured by dl-nfv profile network: {n} {report.backend} processes on "
                   f"{len(hosts)} host(s); point-to-point fits per pair (latency + size/bandwidth) "
                   f"over {report.sizes[0]} B to {big} B; AllReduce of {big} B took "
                   f"{report.allreduce_s[-1] * 1e3:.2f} ms (bus bandwidth "
                   f"{report.allreduce_bus_gbps():.2f} Gbps).{measured_how(report)}")
    doc = {"kind": "topology", "schema_version": 1,
           "name": name or f"measured-{host_names[hosts[0]]}-{n}", "description": description,
           "hosts": host_docs}
    if len(hosts) > 1:
        doc["switches"] = [{"name": "net"}]
    if link_docs:
        doc["links"] = link_docs
    topology = from_data(Topology, doc)
    figures = collective_figures(topology, report) if len(hosts) == 1 else None
    if figures is None:
        return topology
    doc["hosts"][0]["interconnect"].update(collective_latency_us=round(figures[0], 3),
                                           collective_bandwidth_gbps=round(figures[1], 4))
    doc["description"] += (f" Collectives: latency {figures[0]:.1f} us and bandwidth "
                           f"{figures[1]:.2f} Gbps per link, fitted to the measured AllReduce.")
    return from_data(Topology, doc)


def measured_how(report: NetworkReport) -> str:
    """How the report's times were taken, for the topology's description: the rounds and
    how much slower than the fastest the median round was (other jobs' share); empty for a
    report without rounds."""
    if report.rounds < 1:
        return ""
    ratios = [m / f for key, fast in report.p2p_s.items()
              for f, m in zip(fast, report.p2p_median_round_s.get(key, ()), strict=False) if f > 0]
    ratios += [m / f for f, m in zip(report.allreduce_s, report.allreduce_median_round_s,
                                     strict=False) if f > 0]
    text = (f" Each time is the fastest of the rounds over every size (a round's time: the "
            f"lower quartile of its messages; more rounds while a size's two fastest differed by more "
            f"than {AGREE:.0%}, {report.rounds} at most)")
    if ratios:
        text += f"; the median round took {min(ratios):.2f}-{max(ratios):.2f}x the fastest"
    return text + "."


def collective_figures(topology: Topology, report: NetworkReport) -> tuple[float, float] | None:
    """``(latency_us, bandwidth_gbps)`` of a one-host topology's interconnect for collectives:
    those with which the cost model's AllReduce over every device fits the measured one.

    The model's AllReduce time is ``A + S x (B + R)``: ``A`` scales with the links'
    latency, ``B`` with their time per byte, ``R`` (the CPU's sums) with neither.
    Each part is read off the model (the slope over the two largest sizes; ``R`` with
    links of unbounded bandwidth) and scaled to the measured fit ``a + S x b``.
    None without an interconnect or AllReduce times, with explicit per-pair links (three
    or more processes: they replace the interconnect's links, and with them its
    figures), or when the measured time per byte is not above the sums' (nothing left
    for the links). O(sizes).
    """
    from dl_nfv.simulator.costs import NetworkCosts

    host = topology.hosts[0]
    ic = host.interconnect
    if ic is None or topology.links or report.world_size < 2 or len(report.allreduce_s) < 2:
        return None
    measured = fit_link(report.sizes, report.allreduce_s)
    a = measured.latency_us / 1e3
    b = 8 / (measured.bandwidth_gbps * 1e6)  # ms per byte
    big = float(max(report.sizes))

    def affine(bandwidth_gbps: float) -> tuple[float, float]:
        link = replace(ic, collective_latency_us=None, collective_bandwidth_gbps=bandwidth_gbps)
        costs = NetworkCosts(replace(topology, hosts=(replace(host, interconnect=link),)))
        names = costs.cluster.device_names
        top = costs.allreduce_ms(names, big)
        return costs.allreduce_ms(names, 1.0), (top - costs.allreduce_ms(names, big / 2)) / (big / 2)

    latency, slope = affine(ic.bandwidth_gbps)
    _, sums = affine(ic.bandwidth_gbps * 1e9)
    if latency <= 0 or slope <= sums or b <= sums:
        return None
    return ic.latency_us * a / latency, ic.bandwidth_gbps * (slope - sums) / (b - sums)
