"""Measuring training steps: the whole step, and every op's forward and backward inside it.

Method
    A *plain step* runs ``module(*inputs)``, the loss and ``backward()`` and is
    timed as a whole. An *instrumented step* runs the same step through the
    traced GraphModule node by node (``torch.fx.Interpreter``), timing each
    node's forward and charging it to its op; every autograd node the op
    creates (found by walking ``grad_fn`` from the op's outputs, stopping at
    nodes of earlier ops) gets a pre- and a post-hook, and the backward pass is
    cut at these hooks: each interval between consecutive hook events is
    charged to the op whose autograd node runs next, so the per-op backward
    times add up to the measured backward pass. Autograd nodes of the loss are
    charged to the loss, which is not an op of the graph. In the forward pass
    the time between two nodes (the interpreter freeing the values the previous
    node used last) is charged to the previous node's op, and after the
    backward pass the engine's wind-down to the op that ran last, so the
    per-op sum covers the whole step except the loss and the instrumentation.

    A tied weight (a parameter several ops use) gets one gradient per use, and
    autograd sums them before its accumulation node runs, in the gap before that
    node's pre-hook. That gap is charged to the op that owns the weight (its
    first user, which claims the node) like any other, and recorded on its own as
    well (``summed_s``): a plan that puts the uses on different devices sums them
    by communication instead, so the owner's backward there is shorter by that
    much.

    On CUDA every clock reading synchronises the device first, so kernel time
    lands on the op that launched it. On a CPU with one intra-op thread every op
    computes on the calling thread (autograd runs CPU backward there too), so the
    clock is that thread's CPU time (``time.thread_time``): what a worker of one
    core spends on the op, which other jobs sharing the machine's cores do not
    inflate (a wall clock counts the time they hold the core). With more threads
    the work is spread over a pool, and the clock is the wall clock.

    Instrumentation. Interpreting a node and the two hooks of an autograd node
    cost time a plain step does not spend, and that time lands on the ops. Each
    instrumented round follows a plain step of the same batch (forward and loss
    timed apart from the backward). The excess of the fastest instrumented pass
    (its per-op sum) over the fastest plain pass, divided by the pass's events
    (interpreted nodes in the forward, hooked autograd nodes in the backward), is
    the cost of one event (``per_event_overhead``, ``TimedRounds.per_event_ms``):
    other jobs only ever add time to a step (even to its CPU time: caches, page
    faults), so the fastest of each kind is the least disturbed, however many
    rounds were slowed, where a median follows a majority of slow rounds and a
    single round's excess can be inflated without bound. The instrumentation is
    Python on the calling thread, the same whatever the batch, so the profiler
    bounds the full batch's figure by the smaller batch's
    (``bounded_overhead``): there a step is short and what the rounds still
    disturb, spread over its events, is least. Each op is charged that much less
    per event it had (``less_overhead``). Limits: one figure per event, whatever
    the node's arguments; an op is never charged below zero.

    ``Recorder`` runs one instrumented step; the profiler repeats it and takes
    per-op medians, alternating with plain steps so that both see the same
    machine state.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from .capture import Capture

LOSS = None  # the key under which work outside the graph (the loss) is charged


def make_clock(device: torch.device) -> Callable[[], float]:
    """A clock in seconds for work on ``device``: on CUDA the wall clock after waiting for
    queued work; on a CPU the calling thread's CPU time while torch runs one intra-op
    thread, else the wall clock (module doc)."""
    if device.type == "cuda":
        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return clock
    return cpu_clock


def cpu_clock() -> float:
    """The calling thread's CPU seconds with one intra-op thread, else wall seconds."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def autograd_nodes(values, claimed: dict) -> list:
    """Autograd nodes reachable from ``values``' ``grad_fn`` that are not in ``claimed``."""
    found = []
    stack = [t.grad_fn for t in tree_flatten(values)[0]
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in claimed:
            continue
        claimed[fn] = None
        found.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


class Recorder:
    """One instrumented training step: per-op forward and backward seconds.

    ``counter`` (a ``CostCounter``), when given, is told which op is running
    so it can charge ATen calls to it; the counting pass uses that, the timed
    passes leave it out.
    """

    def __init__(self, capture: Capture, clock: Callable[[], float], counter=None):
        self.capture = capture
        self.clock = clock
        self.counter = counter
        self.fwd_s: dict[str | None, float] = defaultdict(float)
        self.bwd_s: dict[str | None, float] = defaultdict(float)
        self.summed_s: dict[str | None, float] = defaultdict(float)  # tied weights' sums
        # instrumentation events per op: interpreted nodes, hooked autograd nodes
        self.fwd_events: dict[str | None, int] = defaultdict(int)
        self.bwd_events: dict[str | None, int] = defaultdict(int)
        self._tied = capture.tied_parameter_ids
        # fx node name -> (bytes of its output, shape of its first output tensor or None)
        self.value_meta: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        self._claimed: dict = {}
        self._owner: dict = {}
        self._handles: list = []
        self._last = 0.0
        self._last_op: str | None = LOSS
        self._outputs: list | None = None  # with ``input_grads_only``: the ops' outputs

    def run(self, module_inputs, loss_fn: Callable, *, record_meta: bool = False,
            input_grads_only: bool = False):
        """Forward through the graph, loss, backward; returns the loss value.

        ``record_meta`` records the size and shape of every node's output.
        ``input_grads_only`` asks autograd for the gradients of the activations alone
        instead of running ``backward()``: every op's backward then computes the gradients
        it passes on to the ops before it, and no weight gradient.
        """
        self._outputs = [] if input_grads_only else None
        interp = _TimedInterpreter(self, record_meta)
        output = interp.run(*module_inputs)
        if self.counter is not None:
            self.counter.end_forward()
            self.counter.current = LOSS
        t0 = self.clock()
        loss = loss_fn(output)
        self.fwd_s[LOSS] += self.clock() - t0
        for fn in autograd_nodes(loss, self._claimed):
            self._hook(fn, LOSS)
        del output
        if self.counter is not None:
            self.counter.phase = "bwd"
        self._last = self.clock()
        if self._outputs is None:
            loss.backward()
        elif self._outputs:
            torch.autograd.grad(loss, self._outputs, allow_unused=True)
        self._outputs = None
        # The engine's wind-down (freeing the graph) follows the last node that ran.
        self._mark(self._last_op)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._claimed.clear()
        return loss.detach()

    def claim(self, values, op: str, activation: bool = True) -> None:
        """Hook the autograd nodes ``values`` add (charged to ``op``); with
        ``input_grads_only``, an ``activation`` (a value computed from the inputs, not from
        parameters alone: ``weight.t()`` is a weight) is also one whose gradient is asked for."""
        if self._outputs is not None and activation:
            self._outputs.extend(t for t in tree_flatten(values)[0]
                                 if isinstance(t, torch.Tensor) and t.requires_grad)
        for fn in autograd_nodes(values, self._claimed):
            self._hook(fn, op)

    def _hook(self, fn, op: str | None) -> None:
        self.bwd_events[op] += 1
        pre = self._pre
        if id(getattr(fn, "variable", None)) in self._tied:  # a tied weight's AccumulateGrad
            pre = self._pre_summed
        self._handles.append(fn.register_prehook(lambda grads, op=op: pre(op)))
        self._handles.append(fn.register_hook(lambda grad_in, grad_out, op=op: self._post(op)))

    def _mark(self, op) -> None:
        now = self.clock()
        self.bwd_s[op] += now - self._last
        self._last = now

    def _pre(self, op) -> None:
        # The gap since the last event (engine scheduling) belongs to the node about to run.
        self._mark(op)
        if self.counter is not None:
            self.counter.current = op

    def _pre_summed(self, op) -> None:
        start = self._last
        self._pre(op)
        self.summed_s[op] += self._last - start

    def _post(self, op) -> None:
        self._mark(op)
        self._last_op = op


class _TimedInterpreter(fx.Interpreter):
    def __init__(self, recorder: Recorder, record_meta: bool):
        super().__init__(recorder.capture.graph_module, garbage_collect_values=True)
        self.recorder = recorder
        self.record_meta = record_meta
        self.op_of = recorder.capture.op_of
        self.previous: str | None = None
        self.previous_end = 0.0
        self.activations: set[str] = set()  # nodes whose values depend on the inputs

    def run_node(self, n: fx.Node):
        rec = self.recorder
        if n.op == "placeholder" or any(a.name in self.activations for a in n.all_input_nodes):
            self.activations.add(n.name)
        if n.op == "placeholder":
            result = super().run_node(n)
            if self.record_meta:
                rec.value_meta[n.name] = value_meta(result)
            return result
        t0 = rec.clock()
        if self.previous is not None:
            # Between two nodes the interpreter frees the values the previous node used last:
            # that memory work is part of the previous op's cost, as it is in an eager run.
            rec.fwd_s[self.previous] += t0 - self.previous_end
        if n.op == "output":
            return super().run_node(n)
        op = self.op_of[n.name]
        rec.fwd_events[op] += 1
        if rec.counter is not None:
            rec.counter.current = op
        result = super().run_node(n)
        rec.fwd_s[op] += rec.clock() - t0
        self.previous = op
        rec.claim(result, op, n.name in self.activations)
        self.previous_end = rec.clock()  # the walk above is instrumentation, charged to no op
        if self.record_meta:
            rec.value_meta[n.name] = value_meta(result)
        return result


def value_meta(value) -> tuple[int, tuple[int, ...] | None]:
    """(bytes of every tensor in ``value``, shape of its first tensor or None)."""
    tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return nbytes, (tuple(tensors[0].shape) if tensors else None)


def per_event_overhead(timed_s: float, plain_s: float, events: int) -> float:
    """Seconds one instrumentation event costs: the instrumented pass's ``timed_s`` (the sum
    of its per-op medians) over a plain pass's ``plain_s`` (its median), per event of the
    pass (module doc, "Instrumentation"); at least 0, and 0 without events."""
    return max(0.0, (timed_s - plain_s) / events) if events > 0 else 0.0


def less_overhead(ms: float, events: int, per_event_ms: float) -> float:
    """An op's median ``ms`` less ``events`` instrumentation events of ``per_event_ms``; >= 0.

    >>> less_overhead(1.0, 3, 0.1)
    0.7
    """
    return max(0.0, ms - events * per_event_ms)


def bounded_overhead(full_ms: tuple[float, float] | None,
                     small_ms: tuple[float, float] | None) -> tuple[float, float]:
    """The cost of one event at the full batch (forward, backward ms), bounded by the one
    measured at the smaller batch where there is one (module doc, "Instrumentation");
    the smaller batch's alone where the full batch had no plain steps to go by (None),
    and nothing where neither has a figure.

    >>> bounded_overhead((0.068, 0.004), (0.0065, 0.005))
    (0.0065, 0.004)
    >>> bounded_overhead(None, (0.0065, 0.005))
    (0.0065, 0.005)
    """
    if full_ms is None:
        return small_ms if small_ms is not None else (0.0, 0.0)
    if small_ms is None:
        return full_ms
    return (min(full_ms[0], small_ms[0]), min(full_ms[1], small_ms[1]))


def time_plain_step(module, inputs, loss_fn, clock) -> tuple[float, float]:
    """One uninstrumented step (gradients reset first): (forward and loss, backward) seconds."""
    module.zero_grad(set_to_none=True)
    t0 = clock()
    loss = loss_fn(module(*inputs))
    t1 = clock()
    loss.backward()
    return t1 - t0, clock() - t1


class TimedRounds:
    """Instrumented rounds at one batch and thread count, each after a plain step of the
    same batch: per-op forward / backward / tie seconds per round, the plain steps'
    forward and backward seconds, and each op's events (module doc, "Instrumentation")."""

    def __init__(self, cap: Capture):
        self._cap = cap
        self.keys = [*cap.op_ids, LOSS]
        self.fwd_runs: dict = defaultdict(list)
        self.bwd_runs: dict = defaultdict(list)
        self.tie_runs: dict = defaultdict(list)
        self.plain: list[tuple[float, float]] = []
        self.settled_s: float | None = None  # rounds without plain steps: the one that settled
        self.events: tuple[dict, dict] = ({}, {})

    def round(self, clock, module, inputs, loss_fn, plain: tuple[float, float] | None = None,
              *, with_plain: bool = True):
        """One instrumented step, after ``plain`` (a plain step's seconds; timed here if None);
        ``with_plain`` False: no plain step (``per_event_ms`` then has nothing to go by)."""
        if plain is None and with_plain:
            plain = time_plain_step(module, inputs, loss_fn, clock)
        module.zero_grad(set_to_none=True)
        rec = Recorder(self._cap, clock)
        rec.run(inputs, loss_fn)
        for key in self.keys:
            self.fwd_runs[key].append(rec.fwd_s.get(key, 0.0))
            self.bwd_runs[key].append(rec.bwd_s.get(key, 0.0))
        for key, seconds in rec.summed_s.items():
            self.tie_runs[key].append(seconds)
        if plain is not None:
            self.plain.append(plain)
        self.events = (dict(rec.fwd_events), dict(rec.bwd_events))

    def round_sums_s(self) -> tuple[list[float], list[float]]:
        """Per round, the instrumented step's forward and backward per-key sums (seconds)."""
        rounds = len(self.fwd_runs.get(self.keys[0], ())) if self.keys else 0
        return ([sum(v[k] for v in self.fwd_runs.values()) for k in range(rounds)],
                [sum(v[k] for v in self.bwd_runs.values()) for k in range(rounds)])

    def per_event_ms(self) -> tuple[float, float] | None:
        """Cost of one event, forward and backward (ms): the fastest instrumented pass over
        the fastest plain pass, per event (module doc, "Instrumentation"); None without
        plain steps."""
        if not self.plain:
            return None
        out = []
        for k, (sums, events) in enumerate(zip(self.round_sums_s(), self.events, strict=True)):
            plain = min(p[k] for p in self.plain)
            out.append(per_event_overhead(min(sums), plain, sum(events.values())) * 1e3)
        return out[0], out[1]

    def medians_ms(self, per_event_ms: tuple[float, float]) -> tuple[dict, dict]:
        """Per key, the median forward and backward ms less its instrumentation at
        ``per_event_ms`` (forward, backward) per event."""
        per_f, per_b = per_event_ms
        fwd_events, bwd_events = self.events
        return ({k: less_overhead(statistics.median(v) * 1e3, fwd_events.get(k, 0), per_f)
                 for k, v in self.fwd_runs.items()},
                {k: less_overhead(statistics.median(v) * 1e3, bwd_events.get(k, 0), per_b)
                 for k, v in self.bwd_runs.items()})


def machine_name(dev: torch.device) -> str:
    """The CUDA device's name, or the CPU's model name (else the platform's word for it)."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
