"""The dynamic program over ideals that minimises the bottleneck load exactly.

Following Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph
Operators" (NeurIPS 2020), section 4: a contiguous split of a DAG into stages is a chain
of ideals ``{} = I0 < I1 < ... < Ik = V``, stage ``j`` being ``Ij - I(j-1)``. With the
devices grouped into interchangeable classes (``stages.device_classes``) and transfers
that cost the same between any two devices, a stage's load depends only on its two ideals
and its device's class, so

    best[I][c] = min over ideals I' < I and classes k with c[k] >= 1 of
                 max(best[I'][c - e_k], load_k(I - I'))

where ``c`` counts the devices of each class used so far, is exact: the devices within
a class are interchangeable, so which one a stage gets does not matter. ``load_k`` is
the larger of the stage's compute on class ``k`` and the transfer of what it receives
(``stages``), and is infinite where the stage does not fit in class ``k``'s memory.

The table is filled forward: the ideals come by size, so every ideal's entries are final
before it is extended, and each ideal ``I'`` is extended to all of its supersets at once
with numpy (a superset contains the maximal blocks of ``I'``). Per ideal the bytes a
stage receives are the largest edge from each op on the frontier of ``I'`` into the
stage (``Tables``).

Complexity: O(ideals^2 x (classes x count vectors + frontier edges)) time and
O(ideals x (blocks + count vectors)) memory, where the count vectors number
``prod(n_k + 1)`` over the classes' sizes ``n_k`` (each capped at the number of blocks).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import Optimizer
from dl_nfv.simulator.costs import CostModel

from .blocks import BlockGraph, ExactLimit
from .stages import DeviceClass

MAX_COUNT_VECTORS = 4096


@dataclass(frozen=True, slots=True)
class Solution:
    """The optimum: its bottleneck and its stages as (blocks, class index), in order."""

    bottleneck_ms: float
    stages: tuple[tuple[tuple[int, ...], int], ...]
    ideals: int


class Tables:
    """Per block and device class, what ``load_k`` adds up (see ``stages``)."""

    def __init__(self, cm: CostModel, blocks: BlockGraph, classes: list[DeviceClass], *,
                 microbatches: int, optimizer: Optimizer, pair: tuple[str, str] | None):
        m = microbatches
        rows = [[cm.op_index[o] for o in ops] for ops in blocks.blocks]
        types = [cm.device_type_index[c.devices[0]] for c in classes]
        fwd, bwd = cm.scaled_tables(types, 1.0 / m)  # [ops, classes], per microbatch
        runs = np.array([1.0 if cm.needs_grad[o] else 0.0 for o in cm.op_ids])
        per_op = m * (fwd + bwd * runs[:, None])
        self.work = np.array([per_op[r].sum(axis=0) for r in rows]).T  # [classes, blocks]
        self.params = np.array([cm.param_bytes[r].sum() for r in rows])
        self.outputs = np.array([cm.output_bytes[r].sum() for r in rows])
        self.resident = np.array([cm.resident_bytes[r].sum() for r in rows])
        first = [c.devices[0] for c in classes]
        self.update_launch_ms = np.array([cm.update_launch_ms(d) for d in first])
        self.update_ms_per_byte = np.array([cm.update_ms_per_byte(d, optimizer)
                                            + cm.upkeep_ms_per_byte(d, m) for d in first])
        self.memory = np.array([float(c.memory_bytes) for c in classes])
        self.static_factor = 2.0 + optimizer.state_factor
        self.microbatches = m
        self.latency_ms, self.ms_per_byte = cm.transfer_affine(*pair) if pair else (0.0, 0.0)
        # op-level edges between blocks: (producing op, its block, consuming block, bytes),
        # the largest per (op, consuming block), sorted by producing op
        largest: dict[tuple[str, int], float] = {}
        for e in cm.graph.edges:
            a, b = blocks.block_of[e.src], blocks.block_of[e.dst]
            if a != b:
                largest[(e.src, b)] = max(largest.get((e.src, b), 0.0), float(e.bytes))
        keys = sorted(largest, key=lambda k: (cm.op_index[k[0]], k[1]))
        self.edge_op = np.array([cm.op_index[u] for u, _ in keys], dtype=np.int64)
        self.edge_src = np.array([blocks.block_of[u] for u, _ in keys], dtype=np.int64)
        self.edge_dst = np.array([b for _, b in keys], dtype=np.int64)
        self.edge_bytes = np.array([largest[k] for k in keys])
        self._ties(cm, blocks, types, m)
        # block-level edges, to find an ideal's maximal blocks
        self.block_src = np.repeat(np.arange(blocks.size), [len(s) for s in blocks.succs])
        self.block_dst = np.array([b for bs in blocks.succs for b in sorted(bs)], dtype=np.int64)

    def _ties(self, cm: CostModel, blocks: BlockGraph, types: list[int], m: int) -> None:
        """Tied weights whose owner and a sharer lie in different blocks (``stages.split_ties``):
        per owner op, its block, its sharers' blocks and ``M x`` its tie sum per class; per
        tie, the sharer's block, the owner's and the bytes of the copy."""
        sharers: dict[str, set[int]] = {}
        copies = []
        for _, owner, sharer, nbytes in cm.ties:
            a, b = blocks.block_of[owner], blocks.block_of[sharer]
            if a != b:
                sharers.setdefault(owner, set()).add(b)
                copies.append((b, a, float(nbytes)))
        self.tie_owners = [(blocks.block_of[o], np.array(sorted(bs), dtype=np.int64),
                            m * cm.tie_sum_by_type[cm.op_index[o], types])
                           for o, bs in sharers.items()]
        self.copies = copies
        self.tie_blocks = np.array(sorted({b for c in copies for b in c[:2]}), dtype=np.int64)

    def tied(self, ideals: np.ndarray, p: int, later: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the stages from ideal ``p`` to each of ``later``: the tie sums they do not do
        ``[later, classes]`` and the bytes of tied-weight copies they hold ``[later]``."""
        saved = np.zeros((len(later), len(self.memory)))
        copied = np.zeros(len(later))
        if not len(self.tie_blocks):
            return saved, copied
        column = {int(b): i for i, b in enumerate(self.tie_blocks)}
        inside = ideals[np.ix_(later, self.tie_blocks)] & ~ideals[p, self.tie_blocks][None, :]
        for owner, sharer_blocks, ms in self.tie_owners:
            split = inside[:, column[owner]] & ~inside[:, [column[int(b)] for b in sharer_blocks]].all(axis=1)
            saved += split[:, None] * ms[None, :]
        for sharer, owner, nbytes in self.copies:
            copied += nbytes * (inside[:, column[sharer]] & ~inside[:, column[owner]])
        return saved, copied

    def comm_ms(self, received: np.ndarray) -> np.ndarray:
        """``M x transfer_ms(route, received / M)`` (0 where nothing is received)."""
        m = self.microbatches
        return np.where(received > 0, m * self.latency_ms + received * self.ms_per_byte, 0.0)


def count_vectors(classes: list[DeviceClass], blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Every vector of devices used per class (each at most min(class size, blocks)), and
    ``step[c, k]``: the index of ``c + e_k`` (-1 where class ``k`` is used up)."""
    sizes = [min(len(c.devices), blocks) for c in classes]
    vectors = list(itertools.product(*(range(s + 1) for s in sizes)))
    if len(vectors) > MAX_COUNT_VECTORS:
        raise ExactLimit(f"exact: {len(classes)} device classes of sizes {sizes} give "
                         f"{len(vectors)} device-count states, more than {MAX_COUNT_VECTORS}")
    index = {v: i for i, v in enumerate(vectors)}
    step = np.full((len(vectors), len(classes)), -1, dtype=np.int64)
    for v, i in index.items():
        for k in range(len(classes)):
            if v[k] < sizes[k]:
                step[i, k] = index[(*v[:k], v[k] + 1, *v[k + 1:])]
    return np.array(vectors), step


def solve(tables: Tables, ideals: np.ndarray, vectors: np.ndarray, step: np.ndarray, *,
          deadline: float) -> Solution:
    """The optimum over every chain of ideals and class assignment (module docstring); on
    a tie, the fewest stages. Raises ``ExactLimit`` when the CPU clock
    (``time.process_time``) passes ``deadline``; where no layout fits, the bottleneck is
    infinite and there are no stages."""
    n_ideals = len(ideals)
    states = step.shape[0]
    best = np.full((n_ideals, states), np.inf)
    best[0, 0] = 0.0
    came_from = np.full((n_ideals, states, 2), -1, dtype=np.int64)  # (ideal, class)
    work = ideals @ tables.work.T  # [ideals, classes]
    params = ideals @ tables.params
    outputs = ideals @ tables.outputs
    resident = ideals @ tables.resident
    for p in range(n_ideals - 1):
        if not np.isfinite(best[p]).any():
            continue
        if time.process_time() > deadline:
            raise ExactLimit(f"exact: the time limit passed after extending {p} of "
                             f"{n_ideals} ideals")
        later, received = _supersets(tables, ideals, p)
        if not len(later):
            continue
        saved, copied = tables.tied(ideals, p, later)
        stage_params = params[later] - params[p] + copied
        has = stage_params > 0
        update = np.where(has[:, None], tables.update_launch_ms[None, :]
                          + stage_params[:, None] * tables.update_ms_per_byte[None, :], 0.0)
        compute = work[later] - work[p] - saved + update  # [later, classes]
        load = np.maximum(compute, tables.comm_ms(received)[:, None])
        need = (stage_params * tables.static_factor + resident[later] - resident[p]
                + (outputs[later] - outputs[p] + received) / tables.microbatches)
        load[need[:, None] > tables.memory[None, :]] = np.inf
        _relax(best, came_from, p, later, load, step)
    final = best[-1]
    if not np.isfinite(final).any():
        return Solution(np.inf, (), n_ideals)
    stages_used = vectors.sum(axis=1)
    chosen = min(range(states), key=lambda s: (final[s], stages_used[s], s))
    return Solution(float(final[chosen]), _walk_back(ideals, came_from, vectors, chosen),
                    n_ideals)


def _supersets(tables: Tables, ideals: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The ideals strictly containing ideal ``p`` and, per such ideal, the bytes the stage
    between them receives (largest edge per producing op on ``p``'s frontier)."""
    inside = ideals[p]
    # maximal blocks of p: in p, with no successor in p
    internal = inside[tables.block_src] & inside[tables.block_dst]
    tops = inside.copy()
    tops[tables.block_src[internal]] = False
    rest = ideals[p + 1:]
    later = np.flatnonzero(rest[:, tops].all(axis=1)) + p + 1
    frontier = inside[tables.edge_src] & ~inside[tables.edge_dst]
    if not frontier.any() or not len(later):
        return later, np.zeros(len(later))
    ops, dst, nbytes = (tables.edge_op[frontier], tables.edge_dst[frontier],
                        tables.edge_bytes[frontier])
    sent = ideals[np.ix_(later, dst)] * nbytes[None, :]  # [later, frontier edges]
    starts = np.flatnonzero(np.r_[True, ops[1:] != ops[:-1]])
    return later, np.maximum.reduceat(sent, starts, axis=1).sum(axis=1)


def _relax(best: np.ndarray, came_from: np.ndarray, p: int, later: np.ndarray,
           load: np.ndarray, step: np.ndarray) -> None:
    """Extend every finite state of ideal ``p`` by one stage on each class to ``later``."""
    for k in range(step.shape[1]):
        src = np.flatnonzero(np.isfinite(best[p]) & (step[:, k] >= 0))
        if not len(src):
            continue
        dst = step[src, k]
        value = np.maximum(best[p, src][None, :], load[:, k][:, None])  # [later, src]
        rows, cols = np.ix_(later, dst)
        better = value < best[rows, cols]
        if not better.any():
            continue
        i, j = np.nonzero(better)
        best[later[i], dst[j]] = value[i, j]
        came_from[later[i], dst[j]] = (p, k)


def _walk_back(ideals: np.ndarray, came_from: np.ndarray, vectors: np.ndarray, state: int
               ) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The stages of the chain ending in the last ideal at ``state``, first stage first."""
    index = {tuple(v): i for i, v in enumerate(vectors.tolist())}
    out = []
    q = len(ideals) - 1
    while q > 0:
        p, k = (int(x) for x in came_from[q, state])
        blocks = tuple(int(b) for b in np.flatnonzero(ideals[q] & ~ideals[p]))
        out.append((blocks, k))
        previous = vectors[state].copy()
        previous[k] -= 1
        q, state = p, index[tuple(previous.tolist())]
    return tuple(reversed(out))
