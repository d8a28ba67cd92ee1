"""Invariants of every simulation, on random op graphs, clusters and plans (hypothesis).

* no task starts before its dependencies end, and every forward starts after
  the forwards it reads from (checked from the graph, not from the task graph);
* a device runs one compute task at a time; a link (and a collective stream)
  holds one task at a time, and no task pushes bytes over a link faster than
  the link's bandwidth;
* the iteration is at least the work bound (busiest device) and the longest
  dependency chain (computed here with networkx);
* peak memory is at least the static memory.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import (
    Collective,
    Compression,
    Fusion,
    Group,
    OpKind,
    Pipeline,
    SyncMethod,
    Topology,
    cluster_of,
    from_data,
    parse_schedule,
)
from dl_nfv.simulator import simulate
from dl_nfv.simulator.synthetic import gpipe, one_f_one_b
from dl_nfv.simulator.tasks import TaskKind

from .helpers import graph, op, plan

EPS = 1e-9


@st.composite
def op_graphs(draw):
    n = draw(st.integers(2, 9))
    ops, edges = [], []
    for i in range(n):
        ops.append(op(f"o{i}", draw(st.floats(0.01, 3.0)), draw(st.floats(0.0, 3.0)),
                      param_bytes=draw(st.sampled_from([0, 0, 4096, 2**20, 2**24])),
                      output_bytes=draw(st.sampled_from([0, 4096, 2**20])),
                      kind=draw(st.sampled_from([OpKind.MATMUL, OpKind.OTHER]))))
        if i:
            preds = draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=min(i, 2)))
            edges += [(f"o{j}", f"o{i}", draw(st.sampled_from([0, 4096, 2**20, 2**24])))
                      for j in sorted(preds)]
    return graph(ops, edges, batch_size=8)


@st.composite
def topologies(draw):
    hosts = []
    n_hosts = draw(st.integers(1, 3))
    for h in range(n_hosts):
        host = {"name": f"h{h}", "devices": [{"type": draw(st.sampled_from(["V100-16GB", "T4"])),
                                             "count": draw(st.integers(1, 3))}]}
        kind = draw(st.sampled_from(["nvlink", "pcie", "none"]))
        if kind != "none":
            host["interconnect"] = {"kind": kind, "bandwidth_gbps": draw(st.sampled_from([50, 200])),
                                    "latency_us": draw(st.sampled_from([0.5, 2.0]))}
        if n_hosts > 1:
            host["nics"] = [{"switch": "sw", "bandwidth_gbps": draw(st.sampled_from([1, 10, 100]))}]
        hosts.append(host)
    doc = {"name": "random", "hosts": hosts}
    if n_hosts > 1:
        doc["switches"] = [{"name": "sw"}]
    return from_data(Topology, doc)


def _group(draw, gid, ops, devices):
    k = draw(st.integers(1, min(4, len(devices))))
    devs = tuple(draw(st.permutations(devices))[:k])
    shares = ()
    if k > 1 and draw(st.booleans()):
        raw = [draw(st.integers(1, 5)) for _ in range(k)]
        shares = tuple(r / sum(raw) for r in raw[:-1])
        shares = (*shares, 1.0 - sum(shares))
    sync = draw(st.sampled_from(list(SyncMethod)))
    fields = {}
    if sync == SyncMethod.PS:
        fields["ps_servers"] = (draw(st.sampled_from(devices)),)
    if sync == SyncMethod.ALLREDUCE:
        fields["collective"] = draw(st.sampled_from(list(Collective)))
        if draw(st.booleans()):
            fields["compression"] = Compression.SFB
    return Group(id=gid, ops=tuple(ops), devices=devs, batch_shares=shares, sync=sync, **fields)


@st.composite
def placements(draw):
    """A plan of op groups on devices, maybe with buckets and per-device orders."""
    g = draw(op_graphs())
    t = draw(topologies())
    devices = list(t.device_names)
    topo = g.topological_ids()
    k = draw(st.integers(1, min(3, len(topo))))
    assign = [draw(st.integers(0, k - 1)) for _ in topo]
    groups, buckets = [], []
    index = g.index
    for gi in range(k):
        ops = [o for o, a in zip(topo, assign) if a == gi]
        if not ops:
            continue
        params = [o for o in ops if index[o].param_bytes]
        groups.append(_group(draw, f"g{gi}", ops, devices))
        if params and draw(st.booleans()):
            cut = draw(st.integers(1, len(params)))
            buckets += [tuple(reversed(params[cut:])), tuple(reversed(params[:cut]))]
    fields = {}
    if buckets:
        fields["fusion"] = Fusion(gradient_buckets=tuple(b for b in buckets if b))
    # orders: the topological order restricted to each device (never cyclic)
    if draw(st.booleans()):
        on = defaultdict(list)
        for o in topo:
            for gr in groups:
                if o in gr.ops:
                    for d in gr.devices:
                        on[d].append(o)
        fields["order"] = {d: tuple(ops) for d, ops in on.items() if draw(st.booleans())}
    return g, t, plan(g, t, groups, **fields)


@st.composite
def pipelines(draw):
    g = draw(op_graphs())
    t = draw(topologies())
    devices = list(t.device_names)
    topo = g.topological_ids()
    p = draw(st.integers(1, min(4, len(topo), len(devices))))
    cuts = sorted(draw(st.sets(st.integers(1, len(topo) - 1), min_size=p - 1, max_size=p - 1)))
    bounds = [0, *cuts, len(topo)]
    order = draw(st.permutations(devices))
    per_stage = max(1, len(devices) // p)
    width = draw(st.integers(1, min(2, per_stage)))
    m = draw(st.sampled_from([1, 2, 4, 8]))
    style = draw(st.sampled_from(["gpipe", "1f1b"]))
    groups, schedule = [], {}
    for s in range(p):
        devs = tuple(order[s * per_stage: s * per_stage + width])
        groups.append(Group(id=f"s{s}", ops=tuple(topo[bounds[s]:bounds[s + 1]]), devices=devs,
                            sync=draw(st.sampled_from([SyncMethod.ALLREDUCE, SyncMethod.NONE]))))
        for d in devs:
            schedule[d] = gpipe(s, m) if style == "gpipe" else one_f_one_b(p, m, s)
    pipe = Pipeline(microbatches=m, stages=tuple(gr.id for gr in groups), schedule=schedule)
    return g, t, plan(g, t, groups, pipeline=pipe)


def check_invariants(g, t, p, result) -> None:
    tg, s = result.tasks, result.schedule
    start, end = s.start_ms, s.end_ms
    # dependencies
    for a, nxt in enumerate(tg.succ):
        for b in nxt:
            assert start[b] >= end[a] - EPS, (tg.describe(a), tg.describe(b))
    # one task at a time per device and per resource
    by_device, by_resource = defaultdict(list), defaultdict(list)
    for k in range(len(tg)):
        if tg.device[k] >= 0:
            by_device[tg.device[k]].append((start[k], end[k]))
        for r in tg.resources[k]:
            by_resource[r].append((start[k], end[k]))
    for spans in (*by_device.values(), *by_resource.values()):
        spans.sort()
        for (_, e1), (s2, _) in zip(spans, spans[1:]):
            assert s2 >= e1 - EPS
    # no link faster than its bandwidth
    cluster = cluster_of(t)
    for k, kind in enumerate(tg.kind):
        if kind == TaskKind.TRANSFER:
            loads = {tg.resource_names[r]: tg.nbytes[k] for r in tg.resources[k]}
        elif kind in (TaskKind.ALLREDUCE, TaskKind.ALLGATHER, TaskKind.PS_PUSH, TaskKind.PS_PULL):
            loads = tg.info[k][2]
            held = {tg.resource_names[r] for r in tg.resources[k] if r < tg.n_links}
            assert {h for h, b in loads.items() if b > 0} == held, \
                "a collective holds exactly the links it loads"
        else:
            continue
        for hop, nbytes in loads.items():
            min_ms = nbytes * 8 / (cluster.link(*hop)["bandwidth_gbps"] * 1e9) * 1e3
            assert end[k] - start[k] >= min_ms * (1 - 1e-9) - EPS
    # lower bounds: work and the longest chain (networkx, durations on nodes)
    assert result.iteration_ms >= max(result.busy_ms.values(), default=0.0) - EPS
    dag = nx.DiGraph()
    dag.add_node("start")
    for a in range(len(tg)):
        dag.add_edge("start", a, w=0.0)
        for b in tg.succ[a]:
            dag.add_edge(a, b, w=tg.duration_ms[a])
        dag.add_edge(a, "end", w=tg.duration_ms[a])
    longest = nx.dag_longest_path_length(dag, weight="w")
    assert result.iteration_ms >= longest - 1e-6
    assert abs(result.longest_chain_ms - longest) <= 1e-6
    # forwards read what they need: producer forward ends before consumer forward starts,
    # for every pair of replicas whose batch intervals overlap, in every microbatch
    interval, group_of = {}, {}
    rep = 0
    for gi, gr in enumerate(p.groups):
        lo = 0.0
        for share in gr.shares:
            interval[rep] = (lo, lo + share)
            lo += share
            rep += 1
        for o in gr.ops:
            group_of[o] = gi
    fwd = defaultdict(list)
    for k, kind in enumerate(tg.kind):
        if kind == TaskKind.FORWARD:
            unit, r, m = tg.info[k]
            fwd[tg.unit_names[unit]].append((r, m, k))
    for e in g.edges:
        for ra, ma, ka in fwd[e.src]:
            for rb, mb, kb in fwd[e.dst]:
                (la, ha), (lb, hb) = interval[ra], interval[rb]
                if ma == mb and min(ha, hb) - max(la, lb) > 1e-12:
                    assert start[kb] >= end[ka] - EPS
    # memory
    for d, name in enumerate(tg.device_names):
        assert result.peak_memory_bytes[name] >= int(tg.static_bytes[d]) - 1
    assert result.feasible == (not result.overflows)


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(placements())
def test_invariants_of_placement_plans(case):
    g, t, p = case
    check_invariants(g, t, p, simulate(p, g, t))


@SETTINGS
@given(pipelines())
def test_invariants_of_pipeline_plans(case):
    g, t, p = case
    result = simulate(p, g, t)
    check_invariants(g, t, p, result)
    # each device ran its actions in the schedule's order
    tg, s = result.tasks, result.schedule
    for device, text in p.pipeline.schedule.items():
        d = tg.device_names.index(device)
        ran = sorted((s.start_ms[k], tg.priority[k], k) for k in range(len(tg)) if tg.device[k] == d
                     and tg.kind[k] in (TaskKind.FORWARD, TaskKind.BACKWARD))
        seen = []
        for _, _, k in ran:
            label = ("F" if tg.kind[k] == TaskKind.FORWARD else "B", tg.info[k][2])
            if not seen or seen[-1] != label:
                seen.append(label)
        present = set(seen)
        wanted = [(a.op, a.microbatch) for a in parse_schedule(text)
                  if (a.op, a.microbatch) in present]
        compact = []
        for w in wanted:
            if not compact or compact[-1] != w:
                compact.append(w)
        assert seen == compact
