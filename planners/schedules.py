"""Pipeline schedules as data: each stage's order of forward and backward microbatch tasks.

A ``Schedule`` holds, for every stage of a synchronous pipeline, the order in
which that stage runs ``F`` (forward) and ``B`` (backward) of each microbatch,
as tuples of ``Action`` (the record of ``artifacts.plan``). Its text form is
the action notation of torch.distributed.pipelining, one line per stage
(``0F0 0F1 0B0 ...``: stage, F/B, microbatch), and its CSV form is the one
``torch.distributed.pipelining``'s ``_load_csv(format="compute_only")`` reads:
one row per pipeline rank, one action per cell. Both round-trip exactly.

Generators: ``gpipe`` (all forwards, then all backwards: fill-drain) and
``one_f_one_b`` (warm-up forwards, then alternate, then drain; at most
``stages - s`` microbatches in flight on stage ``s``). Arbitrary orders (such
as the list scheduler's in ``planners.pipeline.scheduler``) are built with
``Schedule(...)`` and checked on construction: every stage runs F and B of
each microbatch exactly once, each B after its F, and ``deadlock_free`` runs
the stages against each other (unit-time dry run) to show that no stage waits
forever for another.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dl_nfv.artifacts import Action, Group, Pipeline, format_schedule, order_problem, parse_schedule


@dataclass(frozen=True, slots=True)
class Schedule:
    """Per-stage action orders of a synchronous pipeline with ``microbatches`` microbatches.

    Every microbatch gets an F and then either a B or an I followed by a W (its backward
    in two parts: input gradients, then weight gradients). Raises ``ValueError`` (naming
    the stage and the action) when an order is incomplete, repeats an action, names
    another stage, or runs a backward part before what it needs.
    """

    microbatches: int
    orders: tuple[tuple[Action, ...], ...]

    def __post_init__(self) -> None:
        if self.microbatches < 1:
            raise ValueError(f"microbatches must be >= 1, got {self.microbatches}")
        if not self.orders:
            raise ValueError("a schedule needs at least one stage")
        m = self.microbatches
        for s, order in enumerate(self.orders):
            for a in order:
                if a.stage != s:
                    raise ValueError(f"stage {s}: action {a} belongs to stage {a.stage}")
                if not 0 <= a.microbatch < m:
                    raise ValueError(f"stage {s}: action {a} names microbatch {a.microbatch}, "
                                     f"but there are {m}")
            problem = order_problem(order, (s,), m)
            if problem:
                raise ValueError(f"stage {s}: {problem}")

    @property
    def stages(self) -> int:
        return len(self.orders)

    # ---------------------------------------------------------------- text forms
    def texts(self) -> tuple[str, ...]:
        """One line per stage in the action notation (``0F0 0F1 0B0 ...``)."""
        return tuple(format_schedule(order) for order in self.orders)

    @classmethod
    def from_texts(cls, texts: Sequence[str], microbatches: int | None = None) -> Schedule:
        """Inverse of ``texts``; ``microbatches`` defaults to what the actions name."""
        orders = tuple(parse_schedule(t) for t in texts)
        if microbatches is None:
            microbatches = 1 + max((a.microbatch for o in orders for a in o), default=0)
        return cls(microbatches=microbatches, orders=orders)

    def to_csv(self) -> str:
        """The torch.distributed.pipelining "compute_only" CSV: one row per stage's rank."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for order in self.orders:
            writer.writerow([str(a) for a in order])
        return out.getvalue()

    @classmethod
    def from_csv(cls, text: str, microbatches: int | None = None) -> Schedule:
        """Inverse of ``to_csv`` (empty cells, as torch writes for idle steps, are skipped)."""
        rows = [[cell.strip() for cell in row if cell.strip()] for row in csv.reader(io.StringIO(text))]
        return cls.from_texts([" ".join(r) for r in rows], microbatches)

    # ---------------------------------------------------------------- plan form
    def device_schedules(self, stage_devices: Sequence[Sequence[str]]) -> dict[str, str]:
        """The plan's per-device text: every replica of stage ``s`` runs stage ``s``'s order."""
        if len(stage_devices) != self.stages:
            raise ValueError(f"{len(stage_devices)} device lists for {self.stages} stages")
        out: dict[str, str] = {}
        for text, devices in zip(self.texts(), stage_devices):
            for d in devices:
                if d in out:
                    raise ValueError(f"device {d!r} runs more than one stage")
                out[d] = text
        return out

    @classmethod
    def from_pipeline(cls, pipeline: Pipeline, groups: Iterable[Group]) -> Schedule:
        """The schedule of a plan's pipeline (read from the first device of each stage).

        Raises ``ValueError`` when replicas of one stage disagree on the order.
        """
        by_id = {g.id: g for g in groups}
        texts = []
        for sid in pipeline.stages:
            devices = by_id[sid].devices
            text = pipeline.schedule.get(devices[0], "")
            for d in devices[1:]:
                if pipeline.schedule.get(d, "") != text:
                    raise ValueError(f"replicas {devices[0]!r} and {d!r} of stage {sid!r} run "
                                     f"different orders")
            texts.append(text)
        return cls.from_texts(texts, pipeline.microbatches)

    # ------------------------------------------------------------------ checks
    def deadlock_free(self) -> bool:
        """Dry run with unit task times: True when every stage can finish its order.

        F of microbatch m on stage s waits for F of m on stage s-1; B (or I) of m on
        stage s waits for B or I of m on stage s+1 (and its own F); W waits for its own I
        alone. O(stages x microbatches).
        """
        return self.dry_run() is None

    def dry_run(self) -> str | None:
        """None when the orders complete, else a sentence naming the stuck actions."""
        done: set[tuple[int, str, int]] = set()
        pos = [0] * self.stages
        last = self.stages - 1
        progress = True
        while progress:
            progress = False
            for s, order in enumerate(self.orders):
                while pos[s] < len(order):
                    a = order[pos[s]]
                    if a.op == "F":
                        ok = s == 0 or (s - 1, "F", a.microbatch) in done
                    elif a.op == "W":  # (its own I comes earlier in the order)
                        ok = True
                    else:
                        ok = s == last or (s + 1, "B", a.microbatch) in done or (
                            s + 1, "I", a.microbatch) in done
                    if not ok:
                        break
                    done.add((s, a.op, a.microbatch))
                    pos[s] += 1
                    progress = True
        stuck = [str(order[pos[s]]) for s, order in enumerate(self.orders) if pos[s] < len(order)]
        if not stuck:
            return None
        return f"the schedule deadlocks: stages wait at {', '.join(stuck)}"

    def max_in_flight(self) -> tuple[int, ...]:
        """Per stage: the most microbatches whose F has run and whose B (or W) has not."""
        out = []
        for order in self.orders:
            live = peak = 0
            for a in order:
                live += 1 if a.op == "F" else -1 if a.ends_backward else 0
                peak = max(peak, live)
            out.append(peak)
        return tuple(out)


@lru_cache(maxsize=64)
def actions(stages: int, microbatches: int, ops: str = "FB") -> tuple[tuple[tuple[Action, ...], ...], ...]:
    """``[op][stage][microbatch]``: every ``Action`` of a pipeline for each of ``ops`` (by
    default F and B; ``"FBIW"`` adds the split backward's two parts), built once per shape;
    actions are immutable, so schedules share them (the pipeline planner builds hundreds of
    thousands of orders, and creating an action costs as much as scheduling it)."""
    _check(stages, microbatches)
    return tuple(tuple(tuple(Action(s, op, k) for k in range(microbatches))
                       for s in range(stages)) for op in ops)


@lru_cache(maxsize=64)
def gpipe(stages: int, microbatches: int) -> Schedule:
    """Fill-drain: every stage runs F0..F(m-1), then B0..B(m-1)."""
    f, b = actions(stages, microbatches)
    return Schedule(microbatches=microbatches, orders=tuple(f[s] + b[s] for s in range(stages)))


@lru_cache(maxsize=64)
def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """One-forward-one-backward with a flush (PipeDream-Flush / DAPPLE order).

    Stage ``s`` runs ``min(stages - s - 1, m)`` warm-up forwards, then
    alternates one forward and one backward, then drains the remaining
    backwards; at most ``stages - s`` microbatches are in flight on it.
    """
    fs, bs = actions(stages, microbatches)
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = list(fs[s][:warmup])
        f, b = warmup, 0
        while f < microbatches:
            order.append(fs[s][f])
            f += 1
            order.append(bs[s][b])
            b += 1
        order.extend(bs[s][b:])
        orders.append(tuple(order))
    return Schedule(microbatches=microbatches, orders=tuple(orders))


def schedule_kind_of(schedule: Schedule) -> str:
    """``gpipe`` or ``1f1b`` when the schedule equals that generator's, else ``custom``."""
    if schedule == gpipe(schedule.stages, schedule.microbatches):
        return "gpipe"
    if schedule == one_f_one_b(schedule.stages, schedule.microbatches):
        return "1f1b"
    return "custom"


def from_mapping(texts: Mapping[int, str], microbatches: int) -> Schedule:
    """A schedule from ``{stage: text}`` (stages 0..n-1)."""
    return Schedule.from_texts([texts[s] for s in range(len(texts))], microbatches)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
