"""Which ops may run as one fused kernel, and the fusion moves DisCo's search makes.

Op classes (from ``Op.kind``):

* **epilogue** ops — elementwise, activation, normalisation, reduction, pooling and
  shape ops: memory-bound ops a compiler fuses into one loop nest (reduction chains
  such as a softmax included);
* **anchors** — convolutions and matmuls: a fused kernel holds at most one, as its
  entry, followed by an epilogue (bias, norm, activation, residual add);
* everything else (inputs, embeddings, attention blocks, recurrent layers, losses,
  opaque blocks) is never fused.

A fused group is valid when its ops are of those classes with at most one anchor that
no other op of the group feeds, are connected by the graph's edges, and the groups
together keep the unit graph acyclic (``simulator.lower.check_fusion`` is the one
check of a finished plan; ``FusionState`` keeps the groups valid as they grow, with a
reachability test bounded by topological position).

``maximal_groups`` is the greedy maximal fusion an XLA-like compiler performs: ops in
topological order, each epilogue op joining the group of the producer that sends it
the most bytes where that keeps the groups valid.
"""

from __future__ import annotations

from collections.abc import Iterable

from dl_nfv.artifacts import OpGraph, OpKind

EPILOGUE = frozenset({OpKind.ELEMENTWISE, OpKind.ACTIVATION, OpKind.NORM, OpKind.REDUCTION,
                      OpKind.POOL, OpKind.SHAPE})
ANCHOR = frozenset({OpKind.CONV, OpKind.MATMUL})


class FusionState:
    """Op groups over one op graph, kept valid under merges (see the module docstring).

    ``group_of`` maps every op to its group id; ``members`` maps a group id to its ops
    in topological order. Ops that are not fusible stay alone.
    """

    def __init__(self, graph: OpGraph, groups: Iterable[Iterable[str]] = ()):
        self.graph = graph
        topo = graph.topological_ids()
        self.pos = {op: i for i, op in enumerate(topo)}
        self.kind = {op.id: op.kind for op in graph.ops}
        self.succ: dict[str, list[str]] = {op: [] for op in topo}
        self.pred: dict[str, list[str]] = {op: [] for op in topo}
        self.edge_bytes: dict[tuple[str, str], int] = {}
        for e in graph.edges:
            self.succ[e.src].append(e.dst)
            self.pred[e.dst].append(e.src)
            self.edge_bytes[(e.src, e.dst)] = e.bytes
        self.group_of = {op: op for op in topo}
        self.members: dict[str, list[str]] = {op: [op] for op in topo}
        for ops in groups:
            ops = sorted(ops, key=self.pos.__getitem__)
            for op in ops[1:]:
                self._join(self.group_of[ops[0]], self.group_of[op])

    def fusible(self, op: str) -> bool:
        return self.kind[op] in EPILOGUE or self.kind[op] in ANCHOR

    def anchors(self, gid: str) -> list[str]:
        return [op for op in self.members[gid] if self.kind[op] in ANCHOR]

    def can_merge(self, a: str, b: str) -> bool:
        """Whether groups ``a`` and ``b`` (ids) may become one: fusible ops, at most one
        anchor and only as the entry, joined by an edge, no path between them through
        other groups."""
        if a == b:
            return False
        ma, mb = self.members[a], self.members[b]
        if not all(self.fusible(op) for op in (*ma, *mb)):
            return False
        both = set(ma) | set(mb)
        anchors = [op for op in both if self.kind[op] in ANCHOR]
        if len(anchors) > 1 or (anchors and any(p in both for p in self.pred[anchors[0]])):
            return False
        if not any(s in both for op in both for s in self.succ[op] if self.group_of[s] != self.group_of[op]):
            return False
        return not self._detour(ma, mb) and not self._detour(mb, ma)

    def _detour(self, src: list[str], dst: list[str]) -> bool:
        """A path from ``src``'s ops to ``dst``'s ops through at least one op of neither, in
        the unit graph (entering a fused group reaches all its ops). O(ops + edges)."""
        inside = set(src) | set(dst)
        dst_set = set(dst)
        seen: set[str] = set()
        todo = [s for op in src for s in self.succ[op] if s not in inside]
        while todo:
            op = todo.pop()
            if op in seen:
                continue
            seen.add(op)
            for other in self.members[self.group_of[op]]:
                if other not in seen:
                    todo.append(other)
            for s in self.succ[op]:
                if s in dst_set:
                    return True
                if s not in inside and s not in seen:
                    todo.append(s)
        return False

    def merge(self, a: str, b: str) -> str:
        """Merge groups ``a`` and ``b`` (``can_merge`` must hold); the merged group's id."""
        return self._join(a, b)

    def _join(self, a: str, b: str) -> str:
        a, b = self.group_of[a], self.group_of[b]
        if a == b:
            return a
        keep, gone = (a, b) if self.pos[self.members[a][0]] <= self.pos[self.members[b][0]] else (b, a)
        merged = sorted((*self.members[keep], *self.members.pop(gone)), key=self.pos.__getitem__)
        self.members[keep] = merged
        for op in merged:
            self.group_of[op] = keep
        return keep

    def neighbours(self, gid: str) -> list[str]:
        """Groups joined to ``gid`` by an edge, producers first, by topological position."""
        out: dict[str, None] = {}
        for op in self.members[gid]:
            for p in self.pred[op]:
                if self.group_of[p] != gid:
                    out.setdefault(self.group_of[p])
            for s in self.succ[op]:
                if self.group_of[s] != gid:
                    out.setdefault(self.group_of[s])
        return sorted(out, key=lambda g: self.pos[self.members[g][0]])

    def groups(self) -> tuple[tuple[str, ...], ...]:
        """The fused groups (two ops or more), in topological order of their first op."""
        gs = [tuple(m) for m in self.members.values() if len(m) > 1]
        return tuple(sorted(gs, key=lambda m: self.pos[m[0]]))


def maximal_groups(graph: OpGraph) -> tuple[tuple[str, ...], ...]:
    """Greedy maximal fusion (XLA-like): each epilogue op, in topological order, joins the
    group of its heaviest producer (edge bytes, then topological position) that it may
    join. O(ops x the ops a reachability test visits)."""
    state = FusionState(graph)
    for op in sorted(state.pos, key=state.pos.__getitem__):
        if state.kind[op] not in EPILOGUE:
            continue
        producers = sorted(state.pred[op], key=lambda p: (-state.edge_bytes[(p, op)], -state.pos[p]))
        for p in producers:
            a, b = state.group_of[p], state.group_of[op]
            if state.can_merge(a, b):
                state.merge(a, b)
                break
    return state.groups()


def sample_groups(graph: OpGraph, count: int, *, seed: int = 0, max_ops: int = 4,
                  ) -> tuple[tuple[str, ...], ...]:
    """Up to ``count`` distinct valid fused groups of 2 to ``max_ops`` ops, for measuring
    (``dl-nfv profile fusion``): each grown from a fusible op drawn with ``seed`` by merges
    with single ops drawn among the valid ones (``FusionState.can_merge``), to a size drawn
    in [2, ``max_ops``]. Every group is valid on its own. In order of drawing;
    O(count x (ops + edges)) for the states, plus the reachability tests."""
    import random

    rng = random.Random(seed)
    start = FusionState(graph)
    fusible = [op for op in sorted(start.pos, key=start.pos.__getitem__) if start.fusible(op)]
    out: dict[tuple[str, ...], None] = {}
    tries = 0
    while fusible and len(out) < count and tries < 20 * count:
        tries += 1
        state = FusionState(graph)
        gid = rng.choice(fusible)
        size = rng.randint(2, max(2, max_ops))
        while len(state.members[gid]) < size:
            options = [n for n in state.neighbours(gid)
                       if len(state.members[n]) == 1 and state.can_merge(gid, n)]
            if not options:
                break
            gid = state.merge(gid, rng.choice(options))
        group = tuple(state.members[gid])
        if len(group) >= 2:
            out.setdefault(group)
    return tuple(out)
