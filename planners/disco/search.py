"""DisCo's backtracking search over joint op-fusion and gradient-bucket strategies.

A **candidate** is a ``fusion`` field: fused op groups (``fusible``'s classes and
validity) and gradient buckets in AllReduce order. Its score is the simulated
iteration time of the data-parallel plan that carries it (``baselines.Setting``); an
invalid candidate (a fusion the simulator refuses) scores infinity.

Moves from a candidate:

* **buckets** — merge two adjacent buckets; split a bucket where its bytes halve; move
  the boundary between two adjacent buckets by a quarter of the smaller one's ops, either
  way. All of them are tried at every node.
* **fusion** — grow a group into an adjacent group (``FusionState.can_merge``), or split a
  fused group into its topological prefix and suffix. ``fusion_moves`` of them, drawn
  with the seeded generator, are tried at every node.

Method (depth-first backtracking): at a node, score every move not scored before; the
best candidate seen is kept. Then descend into the children in order of their score,
only those faster than the node (by more than ``slack`` of it); when a node has no such
child, or its children are exhausted, return to its parent and try the parent's next
child. The search stops when the best candidate is within ``bound_gap`` of the
ideal-overlap bound (no candidate can gain more), after ``max_evaluations`` scores, or
after ``time_limit_s`` of CPU time. It starts from the fastest of the seeds it is given.

Complexity: each score is one simulation, O(tasks log tasks); a node tries
O(buckets + fusion_moves) moves. Deterministic for a seed where the evaluation cap, not
the CPU time limit, stops it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dl_nfv.artifacts import BadInput, Fusion, OpGraph

from .fusible import FusionState

Buckets = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    """Fused op groups and gradient buckets (each a tuple of op ids)."""

    op_groups: tuple[tuple[str, ...], ...] = ()
    buckets: Buckets = ()

    @classmethod
    def of(cls, fusion: Fusion | None) -> Candidate:
        if fusion is None:
            return cls()
        return cls(tuple(sorted(tuple(g) for g in fusion.op_groups if len(g) > 1)),
                   tuple(tuple(b) for b in fusion.gradient_buckets))

    def fusion(self) -> Fusion:
        return Fusion(op_groups=self.op_groups, gradient_buckets=self.buckets)


@dataclass(slots=True)
class SearchResult:
    best: Candidate
    best_ms: float
    evaluations: int
    stopped_by: str  # "bound", "evaluations", "time", "exhausted"
    improvements: list[tuple[int, float]] = field(default_factory=list)  # (evaluation, ms)


def bucket_moves(buckets: Buckets, nbytes: Callable[[str], float]) -> list[Buckets]:
    """Every merge of adjacent buckets, split at the byte midpoint, and boundary move."""
    out: list[Buckets] = []
    bs = [list(b) for b in buckets]
    for i in range(len(bs) - 1):
        out.append((*buckets[:i], (*buckets[i], *buckets[i + 1]), *buckets[i + 2:]))
    for i, b in enumerate(bs):
        if len(b) < 2:
            continue
        total, run, cut = sum(nbytes(op) for op in b), 0.0, 1
        for k, op in enumerate(b[:-1]):
            run += nbytes(op)
            cut = k + 1
            if run >= total / 2:
                break
        out.append((*buckets[:i], tuple(b[:cut]), tuple(b[cut:]), *buckets[i + 1:]))
    for i in range(len(bs) - 1):
        a, b = bs[i], bs[i + 1]
        k = max(1, min(len(a), len(b)) // 4)
        if len(a) > k:
            out.append((*buckets[:i], tuple(a[:-k]), tuple(a[-k:] + b), *buckets[i + 2:]))
        if len(b) > k:
            out.append((*buckets[:i], tuple(a + b[:k]), tuple(b[k:]), *buckets[i + 2:]))
    return out


def fusion_moves(graph: OpGraph, groups: tuple[tuple[str, ...], ...], rng: random.Random,
                 limit: int) -> list[tuple[tuple[str, ...], ...]]:
    """Up to ``limit`` fusions one move from ``groups``: a group grown into an adjacent
    group, or a fused group split into a topological prefix and suffix."""
    state = FusionState(graph, groups)
    movable = sorted(gid for gid in state.members if state.fusible(gid) or len(state.members[gid]) > 1)
    out: list[tuple[tuple[str, ...], ...]] = []
    seen: set = set()
    tries = 0
    while len(out) < limit and movable and tries < 20 * limit:
        tries += 1
        gid = rng.choice(movable)
        members = state.members[gid]
        if len(members) > 1 and rng.random() < 0.5:
            cut = rng.randrange(1, len(members))
            rest = [g for g in groups if g[0] not in members]
            parts = (tuple(members[:cut]), tuple(members[cut:]))
            new = tuple(sorted((*rest, *(p for p in parts if len(p) > 1))))
        else:
            options = [n for n in state.neighbours(gid) if state.can_merge(gid, n)]
            if not options:
                continue
            trial = FusionState(graph, groups)
            trial.merge(gid, rng.choice(options))
            new = tuple(sorted(trial.groups()))
        if new not in seen and new != groups:
            seen.add(new)
            out.append(new)
    return out


def backtrack(seeds: Sequence[Candidate], score: Callable[[Candidate], float], graph: OpGraph, *,
              bound_ms: float, seed: int = 0, time_limit_s: float = 20.0,
              max_evaluations: int = 400, fusion_moves_per_node: int = 6, slack: float = 0.0,
              bound_gap: float = 0.001) -> SearchResult:
    """Backtracking search from the fastest of ``seeds`` (module docstring).

    ``score`` returns a candidate's simulated iteration ms (``inf`` where invalid).
    Raises ``BadInput`` when no seed is valid.
    """
    rng = random.Random(seed)
    t0 = time.process_time()
    nbytes = {op.id: float(op.param_bytes) for op in graph.ops}.__getitem__
    scores: dict[Candidate, float] = {}
    result = SearchResult(best=Candidate(), best_ms=math.inf, evaluations=0, stopped_by="exhausted")

    def stop() -> str:
        if result.best_ms <= bound_ms * (1 + bound_gap):
            return "bound"
        if result.evaluations >= max_evaluations:
            return "evaluations"
        if time.process_time() - t0 >= time_limit_s:
            return "time"
        return ""

    def evaluate(c: Candidate) -> float:
        if c not in scores:
            scores[c] = score(c)
            result.evaluations += 1
            if scores[c] < result.best_ms:
                result.best, result.best_ms = c, scores[c]
                result.improvements.append((result.evaluations, scores[c]))
        return scores[c]

    for c in seeds:
        evaluate(c)
    if not math.isfinite(result.best_ms):
        raise BadInput("disco: no seed strategy is valid for this graph")

    def children(node: Candidate) -> list[tuple[float, Candidate]]:
        moves = [Candidate(node.op_groups, b) for b in bucket_moves(node.buckets, nbytes)]
        moves += [Candidate(g, node.buckets)
                  for g in fusion_moves(graph, node.op_groups, rng, fusion_moves_per_node)]
        out = []
        for c in moves:
            if c in scores:
                continue
            out.append((evaluate(c), c))
            if stop():
                break
        return sorted(out, key=lambda x: x[0])

    # an explicit stack of (node ms, the node's children still to visit)
    start = result.best
    stack = [(result.best_ms, iter(children(start)))]
    while stack and not stop():
        node_ms, todo = stack[-1]
        nxt = next(todo, None)
        if nxt is None or nxt[0] >= node_ms * (1 - slack):
            stack.pop()  # no improving child left: backtrack
            continue
        stack.append((nxt[0], iter(children(nxt[1]))))
    result.stopped_by = stop() or "exhausted"
    return result


def simulated_score(simulate_fusion: Callable[[Fusion], float]) -> Callable[[Candidate], float]:
    """A ``score`` for ``backtrack``: the simulated ms, ``inf`` where the simulator refuses
    the candidate's fusion."""
    def score(c: Candidate) -> float:
        try:
            return simulate_fusion(c.fusion())
        except BadInput:
            return math.inf
    return score
