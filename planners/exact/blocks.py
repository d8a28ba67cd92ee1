"""The block DAG the exact planner partitions, and its ideals.

A *block* is a set of ops that every stage of the exact problem keeps together:

* each colocation group (``OpGraph.colocation``) is one block;
* an op that holds no parameters and whose every outgoing edge carries 0 bytes (a shape
  query such as ``x.size()`` and the ``getitem`` of one of its sizes) joins the block of
  its only producer. Such ops multiply the ideals of an operator-level graph (each can
  sit anywhere between its producer and its consumers: a BERT layer has a dozen), and
  keeping one with its producer changes a stage's load by at most the op's own time
  (its outputs cost nothing to send);
* blocks that would then lie on a cycle (a group whose members are joined by a path
  through other ops) are merged into one (the strongly connected components of the
  quotient graph), since no ideal can contain one part of the cycle without the rest.

An *ideal* (down-set) of the block DAG is a set of blocks closed under predecessors;
a contiguous stage is the difference of two nested ideals. ``enumerate_ideals`` lists
every ideal once, by breadth-first search from the empty set, in order of size (so
every ideal comes after all of its subsets), and stops with ``ExactLimit`` past a cap.

Complexity: blocks in O(ops + edges); ideals in O(ideals x width x degree) set
operations, where the width is the largest antichain of the block DAG.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np

from dl_nfv.artifacts import BadInput, OpGraph


class ExactLimit(BadInput):
    """The exact planner cannot finish within its limits (time, number of ideals)."""


@dataclass(frozen=True, slots=True)
class BlockGraph:
    """Blocks (tuples of op ids, in a topological order of the blocks) and their DAG."""

    blocks: tuple[tuple[str, ...], ...]
    preds: tuple[frozenset[int], ...]  # block -> predecessor blocks
    succs: tuple[frozenset[int], ...]
    block_of: dict[str, int]

    @property
    def size(self) -> int:
        return len(self.blocks)


def block_graph(graph: OpGraph) -> BlockGraph:
    """The blocks of ``graph`` (see the module docstring), in a topological order."""
    order = graph.topological_ids()
    position = {op: i for i, op in enumerate(order)}
    parent = {op: op for op in order}

    def root(op: str) -> str:
        while parent[op] != op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    def union(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb, key=position.get)] = min(ra, rb, key=position.get)

    for group in graph.colocation:
        for op in group[1:]:
            union(group[0], op)
    producers: dict[str, set[str]] = defaultdict(set)
    sends: dict[str, bool] = defaultdict(bool)  # op -> some outgoing edge carries bytes
    for e in graph.edges:
        producers[e.dst].add(e.src)
        sends[e.src] |= e.bytes > 0
    index = graph.index
    for op in order:
        if index[op].param_bytes == 0 and not sends[op] and len(producers[op]) == 1:
            union(op, next(iter(producers[op])))
    quotient = nx.DiGraph()
    quotient.add_nodes_from({root(op) for op in order})
    quotient.add_edges_from((root(e.src), root(e.dst)) for e in graph.edges
                            if root(e.src) != root(e.dst))
    condensed = nx.condensation(quotient)
    members: dict[int, list[str]] = defaultdict(list)
    for op in order:
        members[condensed.graph["mapping"][root(op)]].append(op)
    # blocks in the order of their first op (a topological order of the condensation)
    ranked = sorted(members, key=lambda c: position[members[c][0]])
    number = {c: i for i, c in enumerate(_topological(condensed, ranked))}
    blocks = [()] * len(number)
    for c, i in number.items():
        blocks[i] = tuple(members[c])
    preds = [set() for _ in blocks]
    succs = [set() for _ in blocks]
    for a, b in condensed.edges:
        preds[number[b]].add(number[a])
        succs[number[a]].add(number[b])
    block_of = {op: i for i, ops in enumerate(blocks) for op in ops}
    return BlockGraph(tuple(blocks), tuple(map(frozenset, preds)), tuple(map(frozenset, succs)),
                      block_of)


def _topological(dag: nx.DiGraph, preferred: list[int]) -> list[int]:
    """A topological order of ``dag`` that follows ``preferred`` wherever it can."""
    rank = {c: i for i, c in enumerate(preferred)}
    return list(nx.lexicographical_topological_sort(dag, key=rank.__getitem__))


def enumerate_ideals(blocks: BlockGraph, *, max_ideals: int, deadline: float | None = None
                     ) -> np.ndarray:
    """Every ideal of the block DAG as a ``[ideals, blocks]`` boolean matrix, by size.

    Row 0 is the empty ideal and the last row all blocks. Raises ``ExactLimit`` when
    there are more than ``max_ideals`` or the CPU clock (``time.process_time``) passes
    ``deadline``.
    """
    n = blocks.size
    missing = [len(p) for p in blocks.preds]
    start = frozenset(b for b in range(n) if missing[b] == 0)
    level: dict[int, frozenset[int]] = {0: start}  # ideal bitmask -> blocks it can add
    found: list[int] = [0]
    while level:
        if deadline is not None and time.process_time() > deadline:
            raise ExactLimit(f"exact: listing the ideals of the {n}-block graph passed the time "
                             f"limit after {len(found)} ideals")
        following: dict[int, frozenset[int]] = {}
        for ideal, addable in level.items():
            for b in addable:
                grown = ideal | (1 << b)
                if grown in following:
                    continue
                ready = [s for s in blocks.succs[b]
                         if all((grown >> p) & 1 for p in blocks.preds[s])]
                following[grown] = (addable - {b}) | frozenset(ready)
        found.extend(sorted(following))
        if len(found) > max_ideals:
            raise ExactLimit(f"exact: the {n}-block graph has more than {max_ideals} ideals "
                             f"(contiguous cut points); raise --max-ideals or plan it with "
                             f"`plan pipeline`")
        level = following
    matrix = np.zeros((len(found), n), dtype=bool)
    for row, ideal in enumerate(found):
        matrix[row] = _bits(ideal, n)
    return matrix


def _bits(ideal: int, n: int) -> np.ndarray:
    raw = np.frombuffer(ideal.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)
