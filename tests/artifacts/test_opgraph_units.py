"""OpGraph.blocked_units: which units of grouped ops sit on (or after) a cycle."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import Edge, ModelRef, Op, OpGraph


def chain(n: int) -> OpGraph:
    ids = [f"o{i}" for i in range(n)]
    return OpGraph(model=ModelRef(name="chain", batch_size=1), ops=tuple(Op(id=i, name=i) for i in ids),
                   edges=tuple(Edge(src=a, dst=b, bytes=4) for a, b in itertools.pairwise(ids)))


def test_a_group_around_an_outside_op_is_a_cycle():
    g = chain(4)  # o0 -> o1 -> o2 -> o3
    assert g.blocked_units({"o0": "A", "o1": "B", "o2": "A", "o3": "C"}) == {"A", "B", "C"}
    assert g.blocked_units({"o0": "A", "o1": "A", "o2": "B", "o3": "C"}) == set()
    assert g.blocked_units({"o1": "A", "o3": "A"}) == set()  # o2 unmapped: no path through it


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_on_a_chain_units_are_blocked_exactly_when_one_is_split_by_another(labels):
    g = chain(len(labels))
    unit_of = {f"o{i}": u for i, u in enumerate(labels)}
    runs = [u for i, u in enumerate(labels) if i == 0 or labels[i - 1] != u]
    contiguous = len(runs) == len(set(runs))  # each unit one run of the chain: a DAG
    assert (g.blocked_units(unit_of) == set()) == contiguous
