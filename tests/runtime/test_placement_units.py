"""placement_units: which ops of an op-placement plan run together as one unit."""

from __future__ import annotations

from dl_nfv.artifacts import Edge, Group, ModelRef, Op, OpGraph, Plan
from dl_nfv.simulator.units import placement_units

A, B = "h/cpu0", "h/cpu1"


def _graph(ops: list[str], edges: list[tuple[str, str]]) -> OpGraph:
    return OpGraph(model=ModelRef(name="hand", batch_size=4),
                   ops=tuple(Op(id=o, name=o, fwd_ms={"cpu": 1.0}) for o in ops),
                   edges=tuple(Edge(src=a, dst=b) for a, b in edges))


def _units(graph: OpGraph, placement: dict[str, tuple[str, ...]], order=None) -> dict[str, str]:
    groups = {}
    for op, devices in placement.items():
        groups.setdefault(devices, []).append(op)
    plan = Plan(planner="hand", graph_sha256="0" * 64, topology_sha256="0" * 64, batch_size=4,
                groups=tuple(Group(id=f"g{i}", ops=tuple(ops), devices=devices)
                             for i, (devices, ops) in enumerate(groups.items())),
                order=order or {})
    group_of = {op: g for g in plan.groups for op in g.ops}
    return placement_units(plan, graph, group_of)


def test_a_chain_split_in_blocks_gives_one_unit_per_block():
    ops = [f"o{i}" for i in range(8)]
    graph = _graph(ops, list(zip(ops, ops[1:])))
    placement = {op: ((A,) if i // 2 % 2 == 0 else (B,)) for i, op in enumerate(ops)}
    assert _units(graph, placement) == {"o0": "o0", "o1": "o0", "o2": "o2", "o3": "o2",
                                        "o4": "o4", "o5": "o4", "o6": "o6", "o7": "o6"}


def test_replicated_ops_merge_apart_from_an_unreplicated_one():
    ops = ["a", "b", "c", "fc"]
    graph = _graph(ops, [("a", "b"), ("b", "c"), ("c", "fc")])
    units = _units(graph, {"a": (A, B), "b": (A, B), "c": (A, B), "fc": (A,)})
    assert units == {"a": "a", "b": "a", "c": "a", "fc": "fc"}


def test_ops_joined_through_another_device_stay_apart():
    # a -> x -> c with x on the other device: a and c follow each other on A, but one
    # unit {a, c} would both feed x and wait for it
    graph = _graph(["a", "x", "c"], [("a", "x"), ("x", "c"), ("a", "c")])
    units = _units(graph, {"a": (A,), "x": (B,), "c": (A,)})
    assert units == {"a": "a", "x": "x", "c": "c"}


def test_units_that_would_wait_for_each_other_fall_back_to_one_op_each():
    # A runs p then q (unrelated); B runs r then s; p -> s and r -> q. Merging {p, q} and
    # {r, s} would make each unit wait for the other.
    graph = _graph(["p", "r", "q", "s"], [("p", "s"), ("r", "q")])
    units = _units(graph, {"p": (A,), "q": (A,), "r": (B,), "s": (B,)},
                   order={A: ("p", "q"), B: ("r", "s")})
    assert units == {"p": "p", "q": "q", "r": "r", "s": "s"}


def test_ops_in_a_line_on_one_device_form_one_unit():
    graph = _graph(["a", "b", "c"], [("a", "b"), ("b", "c")])
    units = _units(graph, {"a": (A,), "b": (A,), "c": (A,)}, order={A: ("a", "b", "c")})
    assert set(units.values()) == {"a"}


def test_a_run_ends_at_an_op_that_sends_and_starts_at_one_that_receives():
    # A runs a, b, c, d in a line; a also feeds x on B, and y on B feeds c. One unit of
    # a..d would hold x back until d ended and wait for y before a started: the run is cut
    # after a (it sends) and before c (it receives).
    graph = _graph(["a", "b", "c", "d", "x", "y"],
                   [("a", "b"), ("b", "c"), ("c", "d"), ("a", "x"), ("x", "y"), ("y", "c")])
    units = _units(graph, {"a": (A,), "b": (A,), "c": (A,), "d": (A,), "x": (B,), "y": (B,)})
    assert units == {"a": "a", "b": "b", "c": "c", "d": "c", "x": "x", "y": "x"}
