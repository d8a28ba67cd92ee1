"""The batch loop every engine shares: cut batches, split them, run both sides, merge.

Per batch ``k`` (FlowShader's structure): the CPU share of ``k`` is already
queued at the worker pool (with the state of flows that move to the CPU
side); run the tensor path on the GPU share in this process, then build batch
``k+1`` (double buffering), ask the workers to hand back the flows that batch
``k+1`` puts on the tensor path, queue ``k+1``'s CPU share behind ``k`` so the
workers never wait for this process, and only then collect ``k``. Per-flow order holds because a flow's
messages of one batch are on one side, batches are processed in order, and
state moves only between batches.
"""

from __future__ import annotations

import gc
import mmap
import os
import time
from dataclasses import dataclass, field

import numpy as np

from dl_nfv.artifacts.nfconfig import EngineSpec
from dl_nfv.artifacts.nfvreport import BatchSplit

from ..nfs.base import FlowTable, GpuBatch, Outputs
from ..nfs.chain import Block, Chain
from ..nfs.lazy_torch import torch
from ..traffic.trace import Trace
from . import EngineChoice
from .costmodel import PROBE_MODES, BatchSizer, CostModel, candidates
from .pool import InlinePool, WorkerPool

UNTOUCHED, ON_GPU = -2, -1


# The batch loop's settings are the nf-config's ``engine`` record (``workers`` 0: automatic;
# its ``name`` is for the dispatcher, the loop takes an ``EngineChoice``): one definition of
# the fields, their defaults and their checks.
EngineOptions = EngineSpec


@dataclass(slots=True)
class EngineResult:
    http: np.ndarray
    drops: np.ndarray
    alerts: list
    monitor: np.ndarray
    batches: list[BatchSplit]
    elapsed_s: float
    startup_s: float
    latency_us: np.ndarray  # per message
    device: str
    workers: int
    stride: int = 1
    rates: dict = field(default_factory=dict)


@dataclass(slots=True)
class _Built:
    number: int
    mode: str
    ids: np.ndarray
    flows: np.ndarray
    gpu_flows: np.ndarray
    cpu_flows: np.ndarray
    gpu: GpuBatch
    blocks: dict
    features: dict
    started: float
    enqueue_s: float
    build_s: float = 0.0  # wall time this process took to build it


class PayloadRelease:
    """The trace's message bytes handed back to the system as the batches that read them are
    done: a page of the payload mapping (the streams ``assemble`` copies into an anonymous
    mapping) is dropped once every message with a byte on it is done (``madvise``:
    ``MADV_REMOVE`` for a shared mapping, ``MADV_DONTNEED`` for a private one, where either
    frees the page); bytes of no message count as done. Batches take the messages in trace
    order, so ``done(stop)`` says every message before ``stop`` is done (and none after it
    has been read yet by anyone). A dropped page reads as zeros: only for a trace nothing
    reads again. A payload that is not such a mapping is left as it is. O(messages + pages)
    per run; the pages' freeing itself would otherwise come when the mapping is unmapped."""

    def __init__(self, trace: Trace):
        blob = trace.blob
        self.blob = blob if (isinstance(blob, mmap.mmap) and hasattr(mmap, "MADV_REMOVE")
                             and len(blob)) else None
        self.advice = getattr(mmap, "MADV_REMOVE", None)
        if self.blob is None:
            return
        self.pages = -(-len(blob) // mmap.PAGESIZE)
        self.offset, self.length = trace.msg_offset, trace.msg_len
        self.left = self._bytes(0, len(self.offset))  # message bytes not done, per page
        self.released = np.zeros(self.pages, dtype=bool)
        self.done_to = 0

    def _bytes(self, start: int, stop: int) -> np.ndarray:
        """Per page: the bytes on it of the messages ``start`` to ``stop``."""
        page = mmap.PAGESIZE
        keep = self.length[start:stop] > 0
        a = self.offset[start:stop][keep]
        b = a + self.length[start:stop][keep]
        first, last = a // page, (b - 1) // page
        one = first == last
        # (float sums: at most a page per page, exact)
        out = np.zeros(self.pages)
        out += np.bincount(first, weights=np.where(one, b - a, (first + 1) * page - a),
                           minlength=self.pages)
        out += np.bincount(last[~one], weights=(b - last * page)[~one], minlength=self.pages)
        # the pages between a message's first and last are all its own
        inner = (np.bincount(first[~one] + 1, minlength=self.pages + 1)
                 - np.bincount(last[~one], minlength=self.pages + 1))
        out += page * np.cumsum(inner[:-1])
        return out.astype(np.int64)

    def done(self, stop: int) -> None:
        """Every message before ``stop`` is done: remove the pages that hold no other."""
        if self.blob is None or stop <= self.done_to:
            return
        self.left -= self._bytes(self.done_to, stop)
        self.done_to = stop
        free = (self.left == 0) & ~self.released
        self.released |= free
        edges = np.flatnonzero(np.diff(np.r_[0, free.view(np.int8), 0]))
        page, size = mmap.PAGESIZE, len(self.blob)
        for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            try:
                self.blob.madvise(self.advice, a * page, min(b * page, size) - a * page)
            except OSError:  # a private mapping (no file behind it to punch): its pages go
                if self.advice == mmap.MADV_DONTNEED:  # by being dropped
                    raise
                self.advice = mmap.MADV_DONTNEED
                self.blob.madvise(self.advice, a * page, min(b * page, size) - a * page)


class HostOnly:
    """The device of an engine without a tensor path (``cpu``): its batches' tensor share is
    always empty, so the engine never needs torch (nor the second its import takes)."""

    type = "cpu"

    def __str__(self) -> str:
        return "cpu"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_workers(choice: EngineChoice, device: torch.device) -> int:
    cores = usable_cores()
    if choice.kind == "gpu":
        return 0
    if choice.kind == "cpu" or device.type == "cpu":
        return cores  # without a GPU the tensor path shares the cores with the workers
    return max(1, cores - 1)  # one core drives the GPU


class Runner:
    def __init__(self, trace: Trace, chain: Chain, choice: EngineChoice, options: EngineOptions,
                 *, release_payload: bool = False):
        self.trace = trace
        self.release_payload = release_payload
        self.chain = chain
        self.choice = choice
        self.options = options
        self.device = HostOnly() if choice.kind == "cpu" else resolve_device(options.device)
        self.workers = options.workers or default_workers(choice, self.device)
        if choice.kind == "gpu" or (choice.kind == "fixed" and choice.cpu_fraction == 0):
            self.workers = 0
        threads = 1
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            threads = props.multi_processor_count * 256
        else:
            threads = 1 << 30  # one "wave": cost grows with rows through the per-byte rate
        ids = chain.nf("ids")
        self.model = CostModel(threads=threads, calibration_batches=options.calibration_batches,
                               reprofile_every=options.reprofile_every, workers=self.workers,
                               cores=usable_cores(), shares_cores=self.device.type != "cuda",
                               stepped=ids is not None and bool(ids.sides))
        self.sizer = BatchSizer(options.batch_size, step=options.batch_step,
                                enabled=options.adaptive_batch and choice.kind == "flowshader")
        self.loc = np.full(len(trace.flows), UNTOUCHED, dtype=np.int64)
        self.stride = 1  # bytes per step of the tensor path's automaton; 1 without one
        if ids is not None and ids.sides and choice.kind != "cpu":
            self.stride = ids.stride()

    # batch building ------------------------------------------------------------
    def _split(self, number: int, flows: np.ndarray, load: np.ndarray, msgs: np.ndarray,
               row: np.ndarray, cands):
        """Boolean per flow (sorted by load ascending): True = GPU path; the mode; the
        number of flows on the GPU path."""
        n = len(flows)
        kind = self.choice.kind
        if kind == "cpu":
            return np.zeros(n, dtype=bool), "cpu", 0
        if kind == "gpu":
            return np.ones(n, dtype=bool), "gpu", n
        if kind == "fixed":
            i = n - int(np.ceil(self.choice.cpu_fraction * n))
            mode = "fixed"
        else:
            i, mode, _ = self.model.split(number, load, msgs, row / self.stride, cands)
        on_gpu = np.zeros(n, dtype=bool)
        on_gpu[:i] = True
        return on_gpu, mode, i

    def batch_size(self, number: int) -> int:
        """Messages in batch ``number``: the sizer's, or for a flowshader calibration or
        re-profiling batch a fraction of it (those batches measure; on short traces a
        full batch at a poor split would cost more than the measurement is worth)."""
        size = self.sizer.size
        if self.choice.kind == "flowshader" and self.model.mode(number) in PROBE_MODES:
            size = min(size, max(64, size // (4 * max(1, self.options.calibration_batches))))
        return size

    def build(self, number: int, start: int, size: int) -> _Built:
        began = time.perf_counter()
        t = self.trace
        ids = np.arange(start, min(t.n_messages, start + size))
        flow_of = t.msg_flow[ids]
        flows, inv, msgs = np.unique(flow_of, return_inverse=True, return_counts=True)
        load = np.bincount(inv, weights=t.msg_len[ids]).astype(np.int64)
        down = np.bincount(inv, weights=t.msg_len[ids] * t.msg_dir[ids]).astype(np.int64)
        row = np.maximum(down, load - down)  # the longest of the flow's two streams
        order = np.argsort(load, kind="stable")
        c = candidates(load[order], msgs[order], self.model.threads, row[order] / self.stride)
        on_gpu_sorted, mode, i = self._split(number, flows[order], load[order], msgs[order],
                                             row[order], c)
        on_gpu = np.empty(len(flows), dtype=bool)
        on_gpu[order] = on_gpu_sorted
        gpu_msg = on_gpu[inv]
        gids = ids[gpu_msg]
        gids = gids[np.argsort(t.msg_flow[gids], kind="stable")]
        gpu = GpuBatch(flow=t.msg_flow[gids], direction=t.msg_dir[gids].astype(np.int64),
                       index=t.msg_index[gids], offset=t.msg_offset[gids], length=t.msg_len[gids],
                       header_len=t.msg_header_len[gids], kind=t.msg_kind[gids].astype(np.int64),
                       ts_us=t.msg_ts_us[gids], packets=t.msg_packets[gids], payload=t.payload,
                       device=self.device, blob=t.blob)
        enqueue_start = time.thread_time()
        blocks = {}
        cids = ids[~gpu_msg]
        if len(cids):
            worker_of = WorkerPool.pin(t.msg_flow[cids], self.workers)
            for w in range(self.workers):
                sel = cids[worker_of == w]
                if len(sel):
                    blocks[w] = Block(flow=t.msg_flow[sel], direction=t.msg_dir[sel].astype(np.int64),
                                      index=t.msg_index[sel], length=t.msg_len[sel],
                                      header_len=t.msg_header_len[sel],
                                      kind=t.msg_kind[sel].astype(np.int64), ts_us=t.msg_ts_us[sel],
                                      packets=t.msg_packets[sel], blob=b"",
                                      offset=t.msg_offset[sel])
        enqueue_s = time.thread_time() - enqueue_start
        features = {"steps": float(c.steps[i]), "waves": float(c.waves[i]),
                    "gpu_bytes": float(c.gpu_bytes[i]), "gpu_msgs": float(c.gpu_msgs[i]),
                    "cpu_bytes": float(c.cpu_bytes[i]), "cpu_msgs": float(c.cpu_msgs[i])}
        return _Built(number=number, mode=mode, ids=ids, flows=flows, gpu_flows=flows[on_gpu],
                      cpu_flows=flows[~on_gpu], gpu=gpu, blocks=blocks, features=features,
                      started=began, enqueue_s=enqueue_s,
                      build_s=time.perf_counter() - began)

    # the loop -------------------------------------------------------------------
    def run(self) -> EngineResult:
        if self.choice.kind != "cpu":
            torch.set_num_threads(max(1, self.options.torch_threads))
        # Every object alive now (modules, the flow records) would be walked by each full
        # garbage collection the per-batch allocations trigger, and by the forked workers'
        # collections, which would copy the pages they touch: freeze them first (without a
        # collection: what little garbage exists now is not worth a walk of everything).
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> EngineResult:
        t0 = time.perf_counter()
        pool = None
        if self.workers == 1 and self.choice.kind == "cpu":  # nothing to overlap with: no fork
            pool = InlinePool(self.chain, self.trace.blob)
        elif self.workers:
            pool = WorkerPool(self.chain, self.workers, self.trace.blob)
        if pool is not None:
            pool.warm_up(_empty_block())
        if self.choice.kind != "cpu":
            self.chain.warm_up(self.device)
            ids = self.chain.nf("ids")
            if ids is not None:  # a measured floor for the per-step rate
                self.model.step_floor_s = ids.step_seconds(self.device)
        startup = time.perf_counter() - t0
        merged = Outputs()
        stats: list[BatchSplit] = []
        latency = np.zeros(self.trace.n_messages, dtype=np.float64)
        release = PayloadRelease(self.trace) if self.release_payload else None
        n = self.trace.n_messages
        try:
            begin = previous = time.perf_counter()
            cur = self.build(0, 0, self.batch_size(0)) if n else None
            pos = 0
            steady = ""
            if cur is not None:
                self._dispatch(pool, cur)
            while cur is not None:
                iteration_cpu = time.process_time()  # this process, its sender threads too
                g0, c0 = time.perf_counter(), time.thread_time()
                gpu_out = Outputs()
                self.chain.gpu_run(cur.gpu, gpu_out)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                    gpu_s = time.perf_counter() - g0
                kernels_cpu_s = time.thread_time() - c0
                if self.device.type != "cuda":  # CPU time: other load does not count
                    gpu_s = kernels_cpu_s
                gpu_s = gpu_s if cur.gpu.size else 0.0
                pos += len(cur.ids)
                # double buffering: batch k+1 is built and queued to the workers (behind
                # batch k and any hand-back request) before batch k's CPU share is collected
                nxt = self.build(cur.number + 1, pos, self.batch_size(cur.number + 1)) \
                    if pos < n else None
                moving = self._request_exports(pool, nxt)
                if nxt is not None:
                    self._dispatch(pool, nxt)
                cpu_s, cpu_total_s = self._collect(pool, cur, merged)
                self._import(pool, moving)
                if release is not None:  # every message up to ``cur``'s last is done
                    release.done(pos)
                _merge(merged, gpu_out)
                done = time.perf_counter()
                latency[cur.ids] = (done - cur.started) * 1e6
                f = cur.features
                stats.append(BatchSplit(
                    index=cur.number, mode=cur.mode, messages=len(cur.ids), flows=len(cur.flows),
                    gpu_flows=len(cur.gpu_flows), gpu_messages=int(f["gpu_msgs"]),
                    gpu_bytes=int(f["gpu_bytes"]), cpu_messages=int(f["cpu_msgs"]),
                    cpu_bytes=int(f["cpu_bytes"]), gpu_ms=gpu_s * 1e3, cpu_ms=cpu_s * 1e3,
                    enqueue_ms=cur.enqueue_s * 1e3, wall_ms=(done - cur.started) * 1e3))
                # this process's own work besides the kernels: building, handing the CPU
                # share over and merging its results (serial with the tensor path)
                main_s = max(0.0, time.process_time() - iteration_cpu - kernels_cpu_s)
                wall_s = done - previous
                self.model.observe(gpu_s=gpu_s, cpu_s=cpu_total_s, enqueue_s=main_s,
                                   wall_s=wall_s, **f)
                # the batch's own wall time: this interval built the next batch, the previous
                # one built this (a small batch must not pay for building a full one)
                own_s = max(1e-9, wall_s - (nxt.build_s if nxt is not None else 0.0)
                            + cur.build_s)
                if cur.mode not in PROBE_MODES:  # steady batches only: one policy per window
                    self.model.observe_wall(cur.mode, cur.features, own_s)
                    if cur.mode != steady:
                        self.sizer.reset()
                        steady = cur.mode
                    self.sizer.observe(len(cur.ids), own_s)
                previous = done
                cur = nxt
            elapsed = time.perf_counter() - begin
        finally:
            if pool is not None:
                pool.close()
        return EngineResult(http=sorted_rows(merged.table("http", 9)),
                            drops=sorted_rows(merged.table("drops", 2)),
                            alerts=sorted(merged.alerts), monitor=_monitor(merged),
                            batches=stats, elapsed_s=elapsed, startup_s=startup,
                            latency_us=latency, device=str(self.device), workers=self.workers,
                            stride=self.stride,
                            rates=self.model.rates() if self.choice.kind == "flowshader" else {})

    def _dispatch(self, pool: WorkerPool | None, cur: _Built) -> None:
        self.loc[cur.gpu_flows] = ON_GPU  # any hand-back from a worker was imported already
        if pool is None:
            return
        imports: dict[int, dict] = {}
        if len(cur.cpu_flows):
            pins = WorkerPool.pin(cur.cpu_flows, self.workers)
            from_gpu = self.loc[cur.cpu_flows] == ON_GPU
            for f, w in zip(cur.cpu_flows[from_gpu].tolist(), pins[from_gpu].tolist()):
                imports.setdefault(w, {})[f] = self.chain.gpu_export(f)
            self.loc[cur.cpu_flows] = pins
        for w, block in cur.blocks.items():
            pool.submit(w, block, imports.pop(w, {}))
        for w, flows in imports.items():  # flows handed over with no message for that worker
            pool.submit(w, _empty_block(), flows)
            cur.blocks[w] = None

    def _request_exports(self, pool: WorkerPool | None, nxt: _Built | None) -> dict:
        if pool is None or nxt is None or not len(nxt.gpu_flows):
            if nxt is not None:
                self.loc[nxt.gpu_flows[self.loc[nxt.gpu_flows] == UNTOUCHED]] = ON_GPU
            return {}
        loc = self.loc[nxt.gpu_flows]
        moving: dict[int, list[int]] = {}
        for f, w in zip(nxt.gpu_flows[loc >= 0].tolist(), loc[loc >= 0].tolist()):
            moving.setdefault(w, []).append(f)
        for w, flows in moving.items():
            pool.request_export(w, flows)
        self.loc[nxt.gpu_flows] = ON_GPU
        return moving

    def _collect(self, pool: WorkerPool | None, cur: _Built, merged: Outputs
                 ) -> tuple[float, float]:
        """Merge the workers' results of ``cur``; the longest and the total worker CPU time."""
        longest = total = 0.0
        if pool is None:
            return 0.0, 0.0
        for w in cur.blocks:
            _, seconds, packed = pool.receive(w)
            longest = max(longest, seconds)
            total += seconds
            for name in ("http", "drops", "monitor"):
                merged.add_chunk(name, packed[name])
            merged.alerts.extend(packed["alerts"])
        return longest, total

    def _import(self, pool: WorkerPool | None, moving: dict) -> None:
        for w in moving:
            _, exports = pool.receive(w)
            for f, value in exports.items():
                self.chain.gpu_import(f, value)


def _empty_block() -> Block:
    z = np.zeros(0, dtype=np.int64)
    return Block(flow=z, direction=z, index=z, length=z, header_len=z, kind=z, ts_us=z,
                 packets=z, blob=b"")


def _merge(into: Outputs, part: Outputs) -> None:
    for name, arrays in part.chunks.items():
        for a in arrays:
            into.add_chunk(name, a)
    for name in ("http", "drops"):
        rows = getattr(part, name)
        if rows:
            into.add_chunk(name, np.asarray(rows, dtype=np.int64))
    if part.monitor:
        into.add_chunk("monitor", part.table("monitor", 6))
    into.alerts.extend(part.alerts)


def sorted_rows(table: np.ndarray) -> np.ndarray:
    if len(table) == 0:
        return table
    return table[np.lexsort(table.T[::-1])]


def _monitor(merged: Outputs) -> np.ndarray:
    """Per flow: messages, packets, bytes (sums), first and last timestamp (min/max)."""
    t = merged.table("monitor", 6)
    if len(t) == 0:
        return t
    flows, inv = np.unique(t[:, 0], return_inverse=True)
    out = np.zeros((len(flows), 6), dtype=np.int64)
    out[:, 0] = flows
    for col in (1, 2, 3):
        np.add.at(out[:, col], inv, t[:, col])
    out[:, 4] = np.iinfo(np.int64).max
    np.minimum.at(out[:, 4], inv, t[:, 4])
    out[:, 5] = np.iinfo(np.int64).min
    np.maximum.at(out[:, 5], inv, t[:, 5])
    return out


def run_engine(trace: Trace, specs, choice: EngineChoice, options: EngineOptions, *,
               release_payload: bool = False) -> EngineResult:
    """Run the NF chain ``specs`` over ``trace`` with engine ``choice``.

    Returns every NF output (sorted rows), per-batch split statistics, timing
    and per-message latency. Raises ``RuntimeFailure`` if a CPU worker fails.
    ``release_payload``: the trace's message bytes are read by nothing after this run,
    so their pages are handed back as the batches are done (``PayloadRelease``).
    """
    chain = Chain(specs, FlowTable.of(trace))
    return Runner(trace, chain, choice, options, release_payload=release_payload).run()
