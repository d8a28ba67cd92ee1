"""Rich rendering of what ``dl-nfv nfv actors`` writes and shows: the cluster file
(``actors-cluster``), a replay's report (``actors-replay``) and measurements
(``actors-run``), the bench's (``actors-bench``), and the switch's status.

``show`` hands any document whose kind starts with ``actors-`` to ``show``, which checks
the fields it renders (``InvalidArtifact`` naming the file and field: exit 2)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from dl_nfv.artifacts.errors import InvalidArtifact


def _need(doc: dict, file: str, *fields: str) -> None:
    for name in fields:
        if name not in doc:
            raise InvalidArtifact("missing", field=name, file=file)


def render_cluster(doc: dict, file: str = "") -> Group:
    from dl_nfv.artifacts.records import from_data
    from dl_nfv.nfv.actors.cluster import ClusterSpec

    try:
        spec = from_data(ClusterSpec, doc)
    except InvalidArtifact as exc:
        raise exc.at(file=file) from None
    head = Text(f"actors-cluster: {len(spec.runtimes)} runtimes, replication "
                f"{'on' if spec.replication else 'off'}, heartbeat {spec.heartbeat_ms:g} ms, "
                f"declared dead after {spec.heartbeat_timeout_ms:g} ms")
    table = Table()
    for col in ("process", "name", "address"):
        table.add_column(col)
    table.add_row("switch", spec.switch.name, spec.switch.address)
    for runtime in spec.runtimes:
        table.add_row("runtime", runtime.name, runtime.address)
    return Group(head, table)


def render_replay(doc: dict, file: str = "") -> Group:
    _need(doc, file, "source", "packets", "passed", "dropped", "flows", "lost", "duplicates",
          "reordered", "digest")
    table = Table(title=f"actors-replay of {doc['source']}", title_justify="left")
    for col in ("packets", "out", "dropped", "flows", "lost", "duplicated", "reordered"):
        table.add_column(col, justify="right")
    table.add_row(str(doc["packets"]), str(doc["passed"]), str(sum(doc["dropped"].values())),
                  str(doc["flows"]), str(doc["lost"]), str(doc["duplicates"]),
                  str(doc["reordered"]))
    drops = ", ".join(f"{nf} {n}" for nf, n in sorted(doc["dropped"].items())) or "none"
    return Group(table, Text(f"dropped by: {drops}\ndigest of outputs and final states: "
                             f"{doc['digest']}"))


def render_run(doc: dict, file: str = "") -> Group:
    _need(doc, file, "wall_s", "packets_per_s", "latency_us", "status")
    lat = doc["latency_us"]
    head = Text(f"actors-run: {doc['wall_s']:.2f} s, {doc['packets_per_s']:.0f} packets/s; "
                f"latency us p50 {lat['p50']:.0f}, p90 {lat['p90']:.0f}, p99 {lat['p99']:.0f}, "
                f"max {lat['max']:.0f}")
    return Group(head, render_status(doc["status"]))


def render_status(status: dict):
    table = Table(title=f"switch {status['switch']}: {status['flows']} flows, replication "
                        f"{'on' if status['replication'] else 'off'}")
    for name in ("runtime", "live", "pid", "flows", "replicas", "un-acked", "processed"):
        table.add_column(name, justify="left" if name == "runtime" else "right")
    for name, r in status["runtimes"].items():
        live = ("yes" if r["live"] else "standby" if r.get("standby") else "no" if r["joined"]
                else "not joined")
        table.add_row(name, live,
                      str(r["pid"]), str(r["flows"]), str(r["replicas"]),
                      str(r["unacked_packets"]), str(r["processed"]))
    lines = []
    for event in status["events"]:
        if "runtime" in event:
            takeover = event["takeover_ms"]
            lines.append(f"{event['runtime']} declared dead after {event['detection_ms']:.0f} ms"
                         f"; takeover " + ("in progress" if takeover is None
                                           else f"{takeover:.1f} ms"))
        else:
            m = event["migration"]
            lines.append(f"migrated {m['flows']} flows {m['source']} -> {m['destination']} "
                         f"({m['mode']}) in {m['completion_ms']:.1f} ms"
                         + (f": failed, {m['failed']}" if "failed" in m else ""))
    return Group(table, Text("\n".join(lines))) if lines else table


def render_bench(result: dict, file: str = "") -> Group:
    _need(result, file, "packets", "runtimes", "throughput", "latency_us", "migration")
    rates = Table(title=f"{result['packets']} packets, {result['runtimes']} runtimes")
    for name in ("replication", "packets/s", "per runtime", "p50 us", "p99 us"):
        rates.add_column(name, justify="left" if name == "replication" else "right")
    for key, label in (("no_replication", "off"), ("replication", "on")):
        t, lat = result["throughput"][key], result["latency_us"][key]
        rates.add_row(label, f"{t['packets_per_s']:.0f}", f"{t['per_runtime']:.0f}",
                      f"{lat['p50']:.0f}", f"{lat['p99']:.0f}")
    parts: list = [rates]
    added = result["latency_us"].get("added")
    if added is not None:
        p99 = added["p99"]
        parts.append(Text(f"replication adds {p99['median']:.0f} us at p99 (median of "
                          f"{len(result['latency_us']['replication']['runs'])} pairs, "
                          f"{p99['min']:.0f} to {p99['max']:.0f}) at "
                          f"{result['latency_rate_pps']:.0f} packets/s"))
    moves = Table(title="migration completion")
    for name in ("flows", "actor ms", "central ms", "central / actor"):
        moves.add_column(name, justify="right")
    times = {(m["flows"], m["mode"]): m["completion_ms"] for m in result["migration"]}
    for n in sorted({n for n, _ in times}):
        a, c = times.get((n, "actor")), times.get((n, "central"))
        moves.add_row(str(n), f"{a:.1f}", f"{c:.1f}", f"{c / a:.1f}x")
    parts.append(moves)
    if "speedup" in result:
        parts.append(Text(f"actor migration {result['speedup']:.1f}x faster than central at "
                          f"{result['speedup_flows']} flows (goal: 10x at 500)"))
    if "recovery" in result:
        r = result["recovery"]
        rec = Table(title=f"recovery after kill -9 of {r['runtime']}")
        for name in ("timeout ms", "detection ms", "takeover ms", "promoted", "re-replicated"):
            rec.add_column(name, justify="right")
        rec.add_row(f"{r['heartbeat_timeout_ms']:.0f}", f"{r['detection_ms']:.0f}",
                    f"{r['takeover_ms']:.1f}", str(r["flows_promoted"]),
                    str(r["flows_rereplicated"]))
        parts.append(rec)
    elif "recovery_skipped" in result:
        parts.append(Text(f"recovery not measured: {result['recovery_skipped']}"))
    return Group(*parts)


RENDERERS: dict[str, Callable] = {"actors-cluster": render_cluster,
                                  "actors-replay": render_replay, "actors-run": render_run,
                                  "actors-bench": render_bench}


def show(doc: dict, file: str):
    """The rendering of an ``actors-*`` document; ``InvalidArtifact`` for an unknown kind."""
    renderer = RENDERERS.get(doc["kind"])
    if renderer is None:
        raise InvalidArtifact(f"unknown kind {doc['kind']!r}; the actors kinds: "
                              f"{', '.join(RENDERERS)}", field="kind", file=file)
    return renderer(doc, file)
