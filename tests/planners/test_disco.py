"""DisCo: the baselines' bucket rules on hand cases, the backtracking search against
enumeration, the ideal-overlap bound below every candidate, refused fusion fields."""

from __future__ import annotations

import itertools

import pytest

from dl_nfv.artifacts import BadInput, Fusion, OpKind
from dl_nfv.planners import run
from dl_nfv.planners.disco.baselines import (
    MB,
    ddp_buckets,
    forward_ms,
    horovod_buckets,
    ideal_overlap_bound,
    last_gradient_ms,
    setting,
)
from dl_nfv.planners.disco.fusible import ANCHOR, FusionState, maximal_groups
from dl_nfv.planners.disco.search import Candidate, backtrack, simulated_score
from dl_nfv.simulator import simulate
from dl_nfv.simulator.lower import check_fusion
from tests.simulator.helpers import graph, mesh, one_group, op, plan

K = OpKind


def _params_chain(mib: list[float]):
    ops = [op(f"op{i}", param_bytes=int(m * MB), kind=K.MATMUL) for i, m in enumerate(mib)]
    return graph(ops, [(f"op{i}", f"op{i + 1}", 4) for i in range(len(mib) - 1)])


def test_ddp_buckets_follow_ddps_rule_first_one_mib_then_25():
    # reverse order op4 (3), op3 (20), op2 (10), op1 (0.75), op0 (0.5) MiB: the first bucket
    # closes at >= 1 MiB (op4 alone), the next at >= 25 MiB (op3 + op2), the rest stays open
    g = _params_chain([0.5, 0.75, 10, 20, 3])
    assert ddp_buckets(g, [o.id for o in g.ops]) == (("op4",), ("op3", "op2"), ("op1", "op0"))


def test_horovod_buckets_fuse_what_is_ready_within_a_cycle_up_to_64_mib():
    g = _params_chain([1, 30, 40, 2, 2])
    ready = {"op4": 1.0, "op3": 2.0, "op2": 6.0, "op1": 7.0, "op0": 12.0}
    # cycles of 5 ms: {op4, op3}, {op2, op1} (40 + 30 MiB > 64: split), {op0}
    assert horovod_buckets(g, ready) == (("op4", "op3"), ("op2",), ("op1",), ("op0",))
    assert horovod_buckets(g, ready, cycle_ms=100.0) == (("op4", "op3", "op2"), ("op1", "op0"))


def _small():
    """input -> conv -> norm -> relu -> matmul -> relu -> matmul -> loss, on two GPUs whose
    mesh is slow enough that the buckets matter."""
    big = 8 * MB
    specs = [("x", K.INPUT, 0, 0.0), ("c1", K.CONV, 30, 3.0), ("n1", K.NORM, 0, 1.0),
             ("a1", K.ACTIVATION, 0, 1.0), ("m2", K.MATMUL, 20, 2.0), ("a2", K.ACTIVATION, 0, 1.0),
             ("m3", K.MATMUL, 10, 2.0), ("loss", K.LOSS, 0, 0.2)]
    ops = [op(name, ms, 2 * ms, param_bytes=int(p * MB), output_bytes=big, kind=kind)
           for name, kind, p, ms in specs]
    edges = [(a[0], b[0], big) for a, b in itertools.pairwise(specs)]
    return graph(ops, edges, batch_size=16), mesh(2, bandwidth_gbps=20.0)


def _all_candidates(g):
    """Every valid fusion (contiguous runs of the fusible chain, a matmul/conv only first)
    with every split of the buckets (reverse order m3, m2, c1) into contiguous runs."""
    segments = [["c1", "n1", "a1"], ["m2", "a2"], ["m3"]]

    def partitions(seq):
        for cuts in itertools.product([False, True], repeat=len(seq) - 1):
            parts, cur = [], [seq[0]]
            for cut, x in zip(cuts, seq[1:]):
                if cut:
                    parts.append(tuple(cur))
                    cur = []
                cur.append(x)
            parts.append(tuple(cur))
            yield parts

    fusions = [tuple(sorted(p for seg in choice for p in seg if len(p) > 1))
               for choice in itertools.product(*(list(partitions(s)) for s in segments))]
    bucketings = [tuple(p) for p in partitions(["m3", "m2", "c1"])]
    return [Candidate(f, b) for f in fusions for b in bucketings]


def test_backtracking_finds_the_optimum_found_by_enumeration():
    g, t = _small()
    s = setting(g, t)
    score = simulated_score(lambda fusion: s.simulate(fusion).iteration_ms)
    every = _all_candidates(g)
    assert len(every) == 8 * 4
    optimum = min(score(c) for c in every)
    worst = max(score(c) for c in every)
    assert worst > optimum * 1.05  # the choice matters
    start = Candidate((), (("m3", "m2", "c1"),))  # no fusion, one bucket
    assert score(start) > optimum * 1.05
    result = backtrack([start], score, g, bound_ms=0.0, seed=0, time_limit_s=60.0,
                       max_evaluations=200)
    assert result.best_ms == pytest.approx(optimum, rel=1e-9)
    planned = run("disco", g, t)
    assert planned.prediction.iteration_ms == pytest.approx(optimum, rel=1e-6)


def test_the_ideal_overlap_bound_is_below_every_candidate_and_disco_below_every_baseline():
    g, t = _small()
    s = setting(g, t)
    bound = ideal_overlap_bound(s)
    times = [s.simulate(c.fusion()).iteration_ms for c in _all_candidates(g)]
    assert bound.ms <= min(times) + 1e-9
    disco = run("disco", g, t)
    assert disco.bound_ms == pytest.approx(bound.ms, abs=1e-5)
    for name in ("dp-no-fusion", "dp-horovod", "dp-xla-like"):
        assert disco.prediction.iteration_ms <= run(name, g, t).prediction.iteration_ms + 1e-6


@pytest.mark.parametrize("gbps", [20.0, 2.0, 0.5])
def test_the_bound_with_the_forward_term_stays_below_every_candidate(gbps):
    # the slower the mesh, the more communication dominates and the forward term binds
    g, _ = _small()
    s = setting(g, mesh(2, bandwidth_gbps=gbps))
    bound = ideal_overlap_bound(s)
    times = [s.simulate(c.fusion()).iteration_ms for c in _all_candidates(g)]
    assert bound.ms <= min(times) + 1e-9
    parts = bound.parts
    assert parts["forward, then communication"] == pytest.approx(
        parts["communication, compute hidden"] + forward_ms(s))
    assert bound.ms == max(parts["ideal overlap"], parts["forward, then communication"],
                           parts["gradients by ready time, then their AllReduce"])
    if gbps < 1:
        assert parts["forward, then communication"] > parts["ideal overlap"]


def test_the_ready_time_term_covers_the_first_layers_allreduce_and_the_forward_term():
    # c1 (30 MiB) is upstream of everything: its gradient is ready once the forward and the
    # whole backward have run, at the maximal fusion's cost; then its AllReduce alone
    g, t = _small()
    s = setting(g, t)
    device, share = s.group.devices[0], s.group.shares[0]
    units = [*s.maximal, ("x",), ("m3",), ("loss",)]
    step = sum(s.cm.fused_ms(list(u), device, phase, share) for u in units for phase in ("fwd", "bwd"))
    first = step + s.cm.allreduce_ms(list(s.group.devices), 30.0 * MB, s.group.collective)
    bound = ideal_overlap_bound(s)
    term = bound.parts["gradients by ready time, then their AllReduce"]
    assert term == last_gradient_ms(s) >= first - 1e-9
    assert term >= bound.parts["forward, then communication"] - 1e-9
    times = [s.simulate(c.fusion()).iteration_ms for c in _all_candidates(g)]
    assert term <= min(times) + 1e-9


def test_maximal_fusion_is_valid_and_fuses_every_epilogue_after_an_anchor():
    g, _ = _small()
    groups = maximal_groups(g)
    assert groups == (("c1", "n1", "a1"), ("m2", "a2"))
    state = FusionState(g, groups)
    for members in state.members.values():
        assert len([o for o in members if state.kind[o] in ANCHOR]) <= 1


def _diamond():
    ops = [op(name, kind=K.ELEMENTWISE, param_bytes=4 if name == "a" else 0)
           for name in ("a", "b", "c", "d")]
    return graph(ops, [("a", "b", 4), ("a", "c", 4), ("b", "d", 4), ("c", "d", 4)])


def test_fusing_ops_no_edge_joins_is_refused():
    g, t = _diamond(), mesh(2)
    p = plan(g, t, [one_group(g, t.device_names)], fusion=Fusion(op_groups=(("b", "c"),)))
    with pytest.raises(BadInput, match=r"op_groups\[0\] fuses 'c', which no edge"):
        simulate(p, g, t)
    assert not FusionState(g).can_merge("b", "c")


def test_two_fused_groups_that_wait_on_each_other_are_refused():
    # A = {a1, a2} and B = {b0, b1, b2}: a1 -> b1 and b2 -> a2, so each waits on the other
    ops = [op(name, kind=K.ELEMENTWISE) for name in ("a1", "a2", "b0", "b1", "b2")]
    g = graph(ops, [("a1", "a2", 4), ("b0", "b1", 4), ("b0", "b2", 4), ("a1", "b1", 4),
                    ("b2", "a2", 4)])
    t = mesh(1)
    p = plan(g, t, [one_group(g, t.device_names)],
             fusion=Fusion(op_groups=(("a1", "a2"), ("b0", "b1", "b2"))))
    with pytest.raises(BadInput, match="forms a cycle"):
        check_fusion(p, g)
    state = FusionState(g, [("b0", "b1", "b2")])
    assert not state.can_merge("a1", "a2")


@pytest.mark.parametrize("fusion, message", [
    (Fusion(gradient_buckets=(("ghost",),)), "names op 'ghost'"),
    (Fusion(op_groups=(("a", "ghost"),)), "names op 'ghost'"),
])
def test_bad_buckets_and_groups_are_refused(fusion, message):
    g, t = _diamond(), mesh(2)
    with pytest.raises(BadInput, match=message):
        check_fusion(plan(g, t, [one_group(g, t.device_names)], fusion=fusion), g)


def test_a_bucketed_group_must_bucket_every_gradient():
    g = _params_chain([1, 1, 1])
    t = mesh(2)
    p = plan(g, t, [one_group(g, t.device_names)],
             fusion=Fusion(gradient_buckets=(("op2",), ("op1",))))
    with pytest.raises(BadInput, match="op 'op0' of group 'all' has parameters but is in no bucket"):
        check_fusion(p, g)


def test_same_seed_same_plan():
    g, t = _small()
    a, b = run("disco", g, t, seed=3), run("disco", g, t, seed=3)
    assert a.fusion == b.fusion and a.prediction == b.prediction
