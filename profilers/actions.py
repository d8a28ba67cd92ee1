"""The training runtime's own CPU per unit action, measured on the profiled model.

A plan runs as units (a pipeline's stages, an op placement's runs of ops, the whole model
for one device or data parallelism), and every forward or backward of a unit on a
microbatch is an *action* of the runtime (``runtime.units.UnitRunner``): it cuts the
microbatch's rows, makes the unit's inputs leaves, calls the unit's fx submodule, keeps what
its backward needs, and for the backward runs a separate autograd pass from the unit's
outputs with their gradients, zeroes and adds the gradients of its inputs, and records
spans of the step's timeline. None of that is in the op times, which come from one
uninterrupted step.

Method
    On one CPU thread (the thread's CPU time, as the ops are timed there), the model's
    traced graph is cut in two units at the middle of its ops (a prefix and a suffix in
    topological order, both on one device: no messages), and a step runs ``M``
    microbatches through both (``forward`` of each unit in order, then ``backward`` in
    reverse) with the runtime's own ``UnitRunner``; beside it, ``M`` plain steps of the
    whole model at the microbatch's rows. Every round runs each step once, side by side,
    so a round's difference between two steps is taken at one moment of the machine; the
    median over rounds of those differences gives the excess, divided by the step's
    actions (``2 units x 2 x M``), as the CPU of one action (``ProfileInfo.unit_action_ms``).
    (Differences of each step's fastest round came from different rounds, so the moment of
    one round went into them whole: on the MoE, five probes of one model gave 7-28 us per
    action and 77-175 us per turn that way, 20-33 and 170-199 paired by round.) Rounds
    are added while the difference of a step with more actions than the other is not yet
    resolved (its rounds' signs fall as a coin's could: a sign test, ``resolved``), within
    the probe's budget (below); a difference still not resolved then, and a turn's that
    is not (it may be nothing, which no count of rounds resolves), is 0: three or four
    rounds of ResNet-50's second-long steps otherwise gave 0.8-2.7 ms per turn of noise.
    (With only the rounds the span gave, about 30, the MoE's action came out 0 in one
    profile of eight, 95-143 us in the others.)
    ``M`` is 4 (2, 1) where it divides the batch.

    That excess is not all per action: holding every microbatch's activations until the
    backwards, and the step's own upkeep, cost the same however many units there are.
    The runtime's forwards run faster right after a forward than after a backward, and
    its backwards likewise (what the core last ran is still warm): a GPipe stage runs its
    microbatches' forwards back to back, a 1F1B stage turns between forward and backward
    at every microbatch. So the halves also run in GPipe's order (each half's forwards of
    every microbatch, then each half's backwards: a half's actions back to back, as a
    stage's are on its own device; with the halves' forwards alternating per microbatch
    instead, the MoE's turn read 0.15-0.22 ms in three probes against 0.21-0.28 in three
    of this order, alternating in one process), taking turns with the others: the step of
    turns over the grouped one, over the ``2 (M - 1)`` turns it has more, is the CPU one
    more turn costs (``ProfileInfo.turn_ms``; paired by round as above).

    So two more steps, taking turns with the others at ``SMALL_ROWS`` rows per
    microbatch (what an action costs hardly depends on the rows; the ops' own time is
    then small), run the halves and the graph cut at every op (each op a unit of its
    own): the difference of their times over the difference of their action counts is
    the CPU of one more action alone (``ProfileInfo.op_action_ms``), what an op
    placement whose devices take turns op by op pays per unit. (On one model the halves
    gave 110-240 us per action and the difference 30-40 us.)

Cost
    An action is a fixed CPU cost, so its share of a step shrinks as the step grows: a
    model whose step at one thread is longer than ``FULL_BATCH_S`` runs the halves and
    the plain steps at ``SMALL_ROWS x M`` rows as well (the differences are then taken
    where the actions are a visible part of the step, not inside the noise of a long
    one; holding the activations of a few rows costs less than of the whole batch, which
    such a step would not resolve either). ``rounds`` rounds are timed, more until they
    span the profile's ``span_s`` (``rounds.SPAN_S``: the difference of two steps of a few
    milliseconds each moves with the moment of a shared machine it falls in: MoE's unit
    action came out 0 to 141 us across profiles of five rounds), more while an action's
    difference is unresolved (above), and they stop once they have taken ``BUDGET_S``, at
    least one timed; a model whose round would take longer than that on its own (one row
    per microbatch of a very large model) gets no figure, and the note says so: the simulator then charges no actions, a few hundred
    microseconds against steps of seconds.

Limits: one figure per action whatever the unit's size and the values that cross its
boundary (the halves have one boundary); a split backward's weight
gradients (a pipeline's ``W``) are not an action of their own here; a model whose graph
cannot be cut this way (a value whose shape depends on the data crossing, a model that
fails at the microbatch) gets no figure, and the note says why.
"""

from __future__ import annotations

import math
import statistics
import time
from functools import partial
from typing import NamedTuple

import torch

from .capture import Capture
from .measure import LOSS, TimedRounds
from .probe import probe
from .rounds import MAX_SPAN_ROUNDS

ROUNDS = 5
SMALL_ROWS = 2  # rows per microbatch of the steps whose difference is the actions alone
FULL_BATCH_S = 0.25  # a one-thread step longer than this: every probe step at the small rows
SIGN_P = 0.05  # a paired difference counts where chance would give its rounds' signs less often
BUDGET_S = 10.0  # the timed rounds stop after this much (the settling round not counted)
UNITS = ("head", "tail")


def microbatches(batch_size: int) -> int:
    """The microbatches the probe cuts the batch into: 4, 2 or 1, whichever divides it."""
    return next(m for m in (4, 2, 1) if batch_size % m == 0)


class UnitActions(NamedTuple):
    """What ``unit_action_ms`` measured (ms of CPU on one thread; None: not measured)."""

    unit_ms: float | None  # per unit action
    op_ms: float | None  # per further action of a one-op unit
    turn_ms: float | None  # per further turn between forward and backward
    note: str


def unit_action_ms(cap: Capture, workload, module: torch.nn.Module, batch_size: int,
                   seed: int, rounds: int = ROUNDS, clock=time.thread_time,
                   step_s: float | None = None, span_s: float = 0.0) -> UnitActions:
    """The CPU per unit action, per action of a one-op unit and per turn, and a note, on
    one thread (module doc); None where the model cannot be cut or run that way, or a round
    would take longer than ``BUDGET_S``. ``step_s``: the model's plain step at one thread
    (seconds), where known; ``span_s``: rounds are added until the timed ones span that
    much wall time (module doc, "Cost"). Restores the thread count."""
    ops = [o for o in cap.op_ids if o not in set(cap.input_ops)]
    if len(ops) < 2:
        return UnitActions(None, None, None, "no unit actions measured (fewer than two ops); ")
    m = microbatches(batch_size)
    small = SMALL_ROWS * m  # the two cuts' difference at a few rows: the actions alone
    rows = (batch_size if step_s is None or step_s <= FULL_BATCH_S
            else min(batch_size, small))  # the halves' and the plain steps' batch
    steps_per_round = (4 if m > 1 else 3) if small <= batch_size else (3 if m > 1 else 2)
    round_s = None if step_s is None else steps_per_round * step_s * rows / batch_size
    if round_s is not None and round_s > BUDGET_S:
        return UnitActions(None, None, None, (
            f"no unit actions measured (a round of the probe would take about "
            f"{round_s:.0f} s at one thread, over its {BUDGET_S:.0f} s); "))
    halves = {op: UNITS[k >= len(ops) // 2] for k, op in enumerate(ops)}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        info = probe(cap.graph_module, lambda rows: workload.make_batch(rows, seed)[0])
        steps = {"halves": _UnitStep(cap, workload, info, halves, rows, m, seed)}
        if m > 1:
            steps["grouped"] = partial(steps["halves"], grouped=True)
        base = "halves" if small == rows else "small halves"  # (no step run twice)
        if small <= batch_size:
            try:
                if base not in steps:
                    steps[base] = _UnitStep(cap, workload, info, halves, small, m, seed)
                steps["small ops"] = _UnitStep(cap, workload, info, {op: op for op in ops},
                                               small, m, seed)
                steps["small ops"]()  # a model that fails at so few rows: the halves alone
            except Exception:  # noqa: BLE001 - a value cut at some op, or too few rows
                steps.pop("small halves", None)
                steps.pop("small ops", None)
        mb_inputs, mb_target = workload.make_batch(rows // m, seed)

        def plain() -> None:
            for _ in range(m):
                (workload.loss(module(*mb_inputs), mb_target) / m).backward()

        taken: dict[str, list[float]] = {name: [] for name in [*steps, "plain"]}
        pairs = _pairs(steps, base)
        timed_s, r = 0.0, 0
        while ((r <= rounds or r <= MAX_SPAN_ROUNDS and (
                    timed_s < span_s or not all(resolved(taken[a], taken[b]) for a, b in pairs)))
               and (r < 2 or timed_s < BUDGET_S)):  # round 0 settles them all
            w0 = time.perf_counter()
            for name, seconds in taken.items():
                module.zero_grad(set_to_none=True)
                c0 = clock()
                (steps[name] if name in steps else plain)()
                if r:
                    seconds.append(clock() - c0)
            timed_s += (time.perf_counter() - w0) if r else 0.0
            r += 1
    except Exception as exc:  # noqa: BLE001 - any model the cut or the microbatch breaks
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        return UnitActions(None, None, None,
                           f"no unit actions measured ({type(exc).__name__}: {reason}); ")
    finally:
        torch.set_num_threads(threads)
        module.zero_grad(set_to_none=True)
    turn = None
    if "grouped" in steps:
        steps.pop("grouped")
        turns = 2 * (m - 1)  # the halves' turns beyond the grouped step's one
        turn = paired_ms(taken["halves"], taken["grouped"]) / turns
    actions = {name: 2 * step.units * m for name, step in steps.items()}
    per_action = paired_ms(taken["halves"], taken["plain"]) / actions["halves"]
    at = "" if rows == batch_size else f" at {rows // m} row(s) per microbatch"
    note = (f"runtime {per_action * 1e3:.0f} us of CPU per unit action ({steps['halves'].units} "
            f"units x {m} microbatches{at}, median of {r - 1} rounds' differences, 1 thread)")
    per_op = None
    if "small ops" in steps and actions["small ops"] > actions[base]:
        per_op = (paired_ms(taken["small ops"], taken[base])
                  / (actions["small ops"] - actions[base]))
        note += (f", {per_op * 1e3:.0f} us per further action with every op a unit of its "
                 f"own ({steps['small ops'].units} units, {SMALL_ROWS} row(s) per microbatch)")
    if turn is not None:
        note += (f", {turn * 1e3:.0f} us per further turn between forward and backward (the "
                 f"halves' forwards and backwards in turn against all forwards first)")
    return UnitActions(per_action, per_op, turn, note + "; ")


def _pairs(steps: dict, base: str) -> list[tuple[str, str]]:
    """The probe's steps whose paired differences the rounds go on for until resolved: those
    that are more work by construction (more actions than the other step), so that more
    rounds resolve them; a turn's may be nothing, which no count of rounds resolves."""
    pairs = [("halves", "plain")]
    if "small ops" in steps:
        pairs.append(("small ops", base))
    return pairs


def resolved(seconds: list[float], other: list[float]) -> bool:
    """Whether the rounds tell ``seconds`` above ``other`` (``paired_ms``): as many rounds as
    came out above, or more, would come out with a chance of at most ``SIGN_P`` were each
    round's sign a coin's toss (a one-sided sign test; with fewer than 5 rounds nothing is
    resolved). A difference that is 0 or below is resolved by nothing, whatever the
    rounds."""
    n = len(seconds)
    above = sum(a > b for a, b in zip(seconds, other, strict=True))
    return bool(n) and sum(math.comb(n, k) for k in range(above, n + 1)) / 2 ** n <= SIGN_P


def paired_ms(seconds: list[float], other: list[float]) -> float:
    """The median over rounds of ``seconds - other`` taken in the same round (ms, at least
    0): what the first step costs beyond the second at one moment of the machine. 0 where
    the rounds do not resolve it (``resolved``), so that the noise of a few long rounds
    makes no cost."""
    if not resolved(seconds, other):
        return 0.0
    diffs = [a - b for a, b in zip(seconds, other, strict=True)]
    return max(0.0, statistics.median(diffs)) * 1e3


class _UnitStep:
    """One step of ``m`` microbatches through the units of ``unit_of_op`` on one device with
    the runtime's own ``UnitRunner`` (forwards in order, then backwards in reverse)."""

    def __init__(self, cap: Capture, workload, info, unit_of_op: dict, batch_size: int,
                 m: int, seed: int):
        from dl_nfv.runtime.comm import Comm
        from dl_nfv.runtime.partition import split
        from dl_nfv.runtime.units import Placement, UnitRunner

        names = list(dict.fromkeys(unit_of_op.values()))
        placement = Placement(("probe",), (1.0,))
        part = split(cap.graph_module, cap.op_of, unit_of_op, info,
                     {u: (placement.devices, placement.shares) for u in names})
        self.comm = Comm(0, torch.device("cpu"))
        self.runner = UnitRunner(part, {u: placement for u in part.units}, device="probe",
                                 rank_of={"probe": 0}, microbatches=m, batch_size=batch_size,
                                 comm=self.comm, loss_fn=workload.loss)
        self.order = [u for u in names if u in part.units]
        self.units, self.m = len(self.order), m
        self.batch = workload.make_batch(batch_size, seed)

    def __call__(self, grouped: bool = False) -> None:
        """One step: each microbatch's forwards then its backwards (1F1B's turns), or
        (``grouped``) each unit's forwards of every microbatch in turn, then each unit's
        backwards in reverse (GPipe's order, a unit's actions back to back as a stage's
        are on its device)."""
        runner = self.runner
        self.comm.timeline.begin(time.perf_counter())
        runner.begin_step(*self.batch)
        if grouped:
            for u in self.order:
                for k in range(self.m):
                    runner.forward(u, k)
            for u in reversed(self.order):
                for k in range(self.m):
                    runner.backward(u, k)
        else:
            for k in range(self.m):
                for u in self.order:
                    runner.forward(u, k)
                for u in reversed(self.order):
                    runner.backward(u, k)
        runner.end_step()


def loss_figures(timed: TimedRounds, small, batch_size: int, per_event_ms: tuple[float, float],
                 per_event_small_ms: tuple[float, float]) -> dict[str, float | None]:
    """``ProfileInfo``'s ``loss_ms`` and ``loss_fixed_ms``: the runtime computes the loss
    (outside the graph, so in no op's time) on every microbatch of the unit that ends the
    model. ``loss_ms`` is its median forward + backward in ``timed`` (less its
    instrumentation); ``loss_fixed_ms`` the part that does not shrink with the batch, from
    the rounds ``small`` (``.timed`` at batch ``.small``; None, or ``.failed``: not
    measured) by ``t(f) = fixed + (t - fixed) f``, in ``[0, t]``."""
    fwd, bwd = timed.medians_ms(per_event_ms)
    loss = fwd.get(LOSS, 0.0) + bwd.get(LOSS, 0.0)
    fixed = None
    if small is not None and not small.failed and 0 < small.small < batch_size:
        f = small.small / batch_size
        sf, sb = small.timed.medians_ms(per_event_small_ms)
        at_small = sf.get(LOSS, 0.0) + sb.get(LOSS, 0.0)
        fixed = round(min(loss, max(0.0, (at_small - loss * f) / (1 - f))), 4)
    return {"loss_ms": round(loss, 4), "loss_fixed_ms": fixed}
