"""The async-flow runtime: a trace's messages through a chain of NFs, flow by flow.

Model. The trace's messages are fed in the order the flow table completed
them. Each (flow, NF) pair is a *stage* with its own FIFO: a message enters the
first NF's stage of its flow, and when that NF is done with it (and did not
drop it) it enters the next NF's stage of the same flow. A stage hands its NF
one message at a time, the next only when the previous is finished, so each NF
sees each flow's messages in order, one at a time (per-flow FIFO), while the
stages of every other flow run whenever this one waits on a service. At most
``window`` messages are inside the chain at once; the feeder waits for room.
A stage is created with the first message (or the end) that reaches it; a
flow ends at every NF after its last message, and ends at NF k+1 only after NF
k finished with it.

Three ways to write an NF run on it, with identical outputs:

- ``async``: an ``async def nf(flow, env)`` per flow and NF; ``async for msg in
  flow.messages(*events)`` yields the flow's messages and finishes (forwards,
  or drops after ``flow.drop()``) the previous one when it asks for the next.
  Code before the loop is the flow's open, code after it its close. An
  exception anywhere ends the run (consolidated error handling).
- ``callback``: an object with ``open(flow, done)``, ``message(flow, msg,
  done)``, ``close(flow, done)``, each calling ``done()`` (or ``done(error)``)
  when its chain of callbacks has finished; the stage drives the FIFO.
- ``blocking``: an object with ``open(flow)``, ``message(flow, msg)``,
  ``close(flow)`` making blocking calls; messages are processed one at a time
  in trace order, with no overlap at all (the baseline futures are measured
  against).

Outputs (alerts, drops, per-flow notes) are rows keyed by flow and message
index, sorted at the end, so they do not depend on how waits interleaved.
Flows without any message are not run. Cost: O(1) per message and stage plus
the NF's own work; one asyncio task per (flow, NF) in the async style.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from dl_nfv.artifacts.errors import RuntimeFailure

from .events import Message
from .services import CURRENT_FLOW

CLOSE = object()  # the end of a flow, behind its last message
STYLES = ("async", "callback", "blocking")


@dataclass(slots=True)
class Outcome:
    """What a run produced: rows sorted, counts per NF position."""

    alerts: list = field(default_factory=list)  # (flow, index, nf, code, detail)
    drops: list = field(default_factory=list)  # (flow, index, nf)
    notes: list = field(default_factory=list)  # (flow, nf, value)
    handled: list = field(default_factory=list)  # per NF: messages handed to it
    order: list | None = None  # (nf, flow, index) in the order NFs started them
    elapsed_s: float = 0.0
    flows: int = 0
    messages: int = 0

    def sort(self) -> Outcome:
        self.alerts.sort()
        self.drops.sort()
        self.notes.sort()
        return self


class FlowView:
    """One NF's view of one flow: what NF code calls."""

    __slots__ = ("rt", "pos", "id", "info", "current", "dropped")

    def __init__(self, rt, pos: int, fid: int):
        self.rt = rt
        self.pos = pos
        self.id = fid
        self.info = rt.trace.flows[fid]
        self.current: Message | None = None
        self.dropped = False

    def key(self, name: str) -> str:
        """The store key of this flow's ``name`` state (in the run's namespace)."""
        return f"{self.rt.prefix}{name}:{self.id}"

    def drop(self) -> None:
        """Drop the current message: later NFs do not see it."""
        self.dropped = True

    def alert(self, code, detail: str = "") -> None:
        index = self.current.index if self.current is not None else -1
        self.rt.out.alerts.append((self.id, index, self.pos, str(code), detail))

    def note(self, value) -> None:
        """Record a per-flow output of this NF (e.g. a NAT mapping)."""
        self.rt.out.notes.append((self.id, self.pos, str(value)))

    def _start(self, msg: Message) -> None:
        self.current = msg
        self.dropped = False
        out = self.rt.out
        out.handled[self.pos] += 1
        if out.order is not None:
            out.order.append((self.pos, self.id, msg.index))

    def _finish(self) -> None:
        msg, self.current = self.current, None
        if self.dropped:
            self.rt.drop(self, msg)
        else:
            self.rt.forward(self, msg)


class _Runtime:
    """Feeding, forwarding between stages and completion, shared by the styles."""

    def __init__(self, trace, chain: list, prefix: str, *, window: int = 4096,
                 record_order: bool = False, progress=None):
        self.trace = trace
        self.chain = chain  # per NF position: what the style's stages need
        self.prefix = prefix
        self.window = window
        self.out = Outcome(handled=[0] * len(chain), order=[] if record_order else None)
        self.stages: dict[int, list] = {}
        self.inflight = 0
        self.open_flows = 0
        self.finished = 0
        self.progress = progress  # called with the number of messages finished so far
        self.error: BaseException | None = None

    def messages(self):
        """(message, is the flow's last) in completion order."""
        t = self.trace
        flow = t.msg_flow.tolist()
        last = {f: i for i, f in enumerate(flow)}
        blob = t.blob
        cols = zip(flow, t.msg_index.tolist(), t.msg_dir.tolist(), t.msg_kind.tolist(),
                   t.msg_offset.tolist(), t.msg_len.tolist(), t.msg_header_len.tolist(),
                   t.msg_ts_us.tolist())
        for i, (f, index, d, kind, off, n, hl, ts) in enumerate(cols):
            yield Message(f, index, d, kind, blob[off:off + n], hl, ts), last[f] == i

    def stage(self, fid: int, pos: int):
        stages = self.stages.get(fid)
        if stages is None:
            stages = self.stages[fid] = [None] * len(self.chain)
            self.open_flows += 1
            self.out.flows += 1
        s = stages[pos]
        if s is None:
            s = stages[pos] = self.make(fid, pos)
        return s

    def forward(self, stage: FlowView, item) -> None:
        nxt = stage.pos + 1
        if nxt < len(self.chain):
            self.stage(stage.id, nxt).push(item)
        elif item is CLOSE:
            self.open_flows -= 1
            self.idle()
        else:
            self.complete()

    def drop(self, stage: FlowView, msg: Message) -> None:
        self.out.drops.append((stage.id, msg.index, stage.pos))
        self.complete()

    def complete(self) -> None:
        self.inflight -= 1
        self.finished += 1
        if self.progress is not None:
            self.progress(self.finished)

    def idle(self) -> None:
        pass

    def fail(self, exc: BaseException, stage: FlowView | None = None) -> None:
        if self.error is None:
            self.error = exc


# async and callback: one event loop ------------------------------------------------------------

class _LoopRuntime(_Runtime):
    async def run(self) -> Outcome:
        self.loop = asyncio.get_running_loop()
        self._space: asyncio.Future | None = None
        self._idle: asyncio.Future | None = None
        handler = self.loop.get_exception_handler()
        self.loop.set_exception_handler(self._loop_error)
        start = time.perf_counter()
        try:
            for msg, last in self.messages():
                if self.error is not None:
                    break
                self.out.messages += 1
                first = self.stage(msg.flow, 0)
                self.inflight += 1
                first.push(msg)
                if last:
                    first.push(CLOSE)
                if self.inflight >= self.window and self.error is None:
                    self._space = self.loop.create_future()
                    await self._space
            if self.open_flows and self.error is None:
                self._idle = self.loop.create_future()
                await self._idle
        finally:
            self.loop.set_exception_handler(handler)
        if self.error is not None:
            self.cancel()
            raise _as_failure(self.error)
        self.out.elapsed_s = time.perf_counter() - start
        return self.out.sort()

    def complete(self) -> None:
        super().complete()
        space = self._space
        if space is not None and self.inflight <= self.window // 2 and not space.done():
            space.set_result(None)

    def idle(self) -> None:
        if self.open_flows == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def fail(self, exc: BaseException, stage: FlowView | None = None) -> None:
        if self.error is None:
            where = f" (NF {self.chain[stage.pos].name}, flow {stage.id})" if stage else ""
            self.error = RuntimeFailure(f"{type(exc).__name__}: {exc}{where}") \
                if not isinstance(exc, RuntimeFailure) else exc
        for fut in (self._space, self._idle):
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _loop_error(self, loop, context: dict) -> None:
        exc = context.get("exception") or RuntimeFailure(context.get("message", "event loop error"))
        self.fail(exc)

    def cancel(self) -> None:
        pass


def _as_failure(exc: BaseException) -> BaseException:
    return exc if isinstance(exc, RuntimeFailure) else RuntimeFailure(str(exc))


class AsyncFlow(FlowView):
    """A flow as an async NF sees it: ``async for msg in flow.messages(*events)``."""

    __slots__ = ("queue", "waiter", "events", "task", "through", "closing")

    def __init__(self, rt, pos: int, fid: int, nf):
        super().__init__(rt, pos, fid)
        self.queue: deque = deque()
        self.waiter: asyncio.Future | None = None
        self.events: frozenset | None = None
        self.through = False
        self.closing = False
        self.task = rt.loop.create_task(self._main(nf.run, nf.env))
        self.task.add_done_callback(self._ended)

    async def _main(self, fn, env) -> None:
        CURRENT_FLOW.set(self.id)
        await fn(self, env)

    def messages(self, *events: str) -> AsyncFlow:
        """Iterate over this flow's messages of ``events`` (all when none are named)."""
        self.events = frozenset(events) if events else None
        return self

    def __aiter__(self) -> AsyncFlow:
        return self

    async def __anext__(self) -> Message:
        if self.current is not None:
            self._finish()
        queue, events = self.queue, self.events
        while True:
            while not queue:
                self.waiter = self.rt.loop.create_future()
                await self.waiter
            item = queue.popleft()
            if item is CLOSE:
                self.closing = True
                raise StopAsyncIteration
            if events is None or item.matches(events):
                self._start(item)
                return item
            self.rt.forward(self, item)

    def push(self, item) -> None:
        if self.through:
            self.rt.forward(self, item)
            return
        self.queue.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.rt.fail(exc, self)
            return
        if self.current is not None:
            self._finish()
        self.through = True  # the NF is done with this flow: the rest passes
        while self.queue:
            self.rt.forward(self, self.queue.popleft())
        if self.closing:
            self.rt.forward(self, CLOSE)


class AsyncRuntime(_LoopRuntime):
    def make(self, fid: int, pos: int) -> AsyncFlow:
        return AsyncFlow(self, pos, fid, self.chain[pos])

    def cancel(self) -> None:
        for stages in self.stages.values():
            for s in stages:
                if s is not None and not s.task.done():
                    s.task.cancel()


class CallbackNf:
    """Base of a callback-style NF: every event, nothing to do at a flow's open or close."""

    events: frozenset | None = None

    def __init__(self, env):
        self.env = env

    def open(self, flow, done) -> None:
        done()

    def close(self, flow, done) -> None:
        done()


class CallbackFlow(FlowView):
    """A flow as a callback NF sees it; the stage calls the NF and waits for ``done``."""

    __slots__ = ("queue", "busy", "running", "nf")

    def __init__(self, rt, pos: int, fid: int, nf):
        super().__init__(rt, pos, fid)
        self.queue: deque = deque()
        self.busy = True
        self.running = False
        self.nf = nf
        self._call(nf.open, self._opened)

    def _call(self, method, *args) -> None:
        CURRENT_FLOW.set(self.id)
        try:
            method(self, *args)
        except Exception as exc:  # a callback NF that raised instead of calling done(error)
            self.rt.fail(exc, self)

    def push(self, item) -> None:
        self.queue.append(item)
        self._run()

    def _run(self) -> None:
        if self.running:
            return
        self.running = True
        queue, events, rt = self.queue, self.nf.events, self.rt
        while not self.busy and queue and rt.error is None:
            item = queue.popleft()
            if item is CLOSE:
                self.busy = True
                self._call(self.nf.close, self._closed)
            elif events is None or item.matches(events):
                self.busy = True
                self._start(item)
                self._call(self.nf.message, item, self._done)
            else:
                rt.forward(self, item)
        self.running = False

    def _done(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.rt.fail(error, self)
            return
        self._finish()
        self.busy = False
        self._run()

    def _opened(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.rt.fail(error, self)
            return
        self.busy = False
        self._run()

    def _closed(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.rt.fail(error, self)
            return
        self.rt.forward(self, CLOSE)


class CallbackRuntime(_LoopRuntime):
    def make(self, fid: int, pos: int) -> CallbackFlow:
        return CallbackFlow(self, pos, fid, self.chain[pos].callback)


# blocking: one message at a time ------------------------------------------------------------------

class BlockingNf:
    """Base of a blocking-style NF: every event, nothing to do at a flow's open or close."""

    events: frozenset | None = None

    def __init__(self, env):
        self.env = env

    def open(self, flow) -> None:
        pass

    def close(self, flow) -> None:
        pass


class BlockingFlow(FlowView):
    __slots__ = ()


class BlockingRuntime(_Runtime):
    """Every message through the whole chain before the next; blocking service calls."""

    def make(self, fid: int, pos: int) -> BlockingFlow:
        flow = BlockingFlow(self, pos, fid)
        CURRENT_FLOW.set(fid)
        self.chain[pos].blocking.open(flow)
        return flow

    def run(self) -> Outcome:
        start = time.perf_counter()
        n = len(self.chain)
        for msg, last in self.messages():
            self.out.messages += 1
            for pos in range(n):
                flow = self.stage(msg.flow, pos)
                nf = self.chain[pos].blocking
                if nf.events is not None and not msg.matches(nf.events):
                    continue
                CURRENT_FLOW.set(msg.flow)
                flow._start(msg)
                nf.message(flow, msg)
                flow.current = None
                if flow.dropped:
                    self.out.drops.append((msg.flow, msg.index, pos))
                    break
            self.complete()
            if last:
                for pos in range(n):
                    CURRENT_FLOW.set(msg.flow)
                    self.chain[pos].blocking.close(self.stage(msg.flow, pos))
        self.out.elapsed_s = time.perf_counter() - start
        return self.out.sort()
