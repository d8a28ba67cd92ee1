"""What ``dl-nfv nfv actors`` writes and shows: the replay report and its files, and the
status and bench tables."""

from __future__ import annotations

import json
from pathlib import Path

from dl_nfv.artifacts.io import make_folder, write_text_atomic

from .chain import Output


def replay_report(result: dict, source: str) -> dict:
    """What a replay produced, as plain data: counts and the digest of the outputs and final
    NF states. The same trace and chain give the same report whatever failed or migrated
    meanwhile; how the run went is ``replay_run``'s."""
    counters = result["counters"]
    return {"kind": "actors-replay", "source": source, "packets": result["packets"],
            "passed": counters["passed"], "dropped": counters["dropped"],
            "flows": counters["flows"], "lost": result["lost"],
            "duplicates": result["duplicates"], "reordered": result["reordered"],
            "digest": result["digest"]}


def replay_run(result: dict) -> dict:
    """How a replay went: its speed, packet latency, migrations and the cluster's state."""
    return {"kind": "actors-run", "wall_s": result["wall_s"],
            "packets_per_s": result["packets_per_s"], "latency_us": result["latency_us"],
            "migrations": result["migrations"], "status": result["status"]}


def _address(raw: bytes) -> str:
    import socket

    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def output_row(output: Output) -> dict:
    row = {"packet": output.packet, "flow": output.flow, "dropped_by": output.dropped_by}
    if output.headers:
        src, sport, dst, dport = output.headers
        row.update(src=_address(src), sport=sport, dst=_address(dst), dport=dport)
    return row


def write_replay(result: dict, report: dict, folder: Path) -> None:
    """What the chain produced, nothing measured: ``report.json`` (``replay_report``) and
    ``outputs.jsonl`` (one packet a line, in packet order). Two runs that must agree (a
    fault-free one and one with a runtime killed) write byte-identical folders."""
    make_folder(folder)
    write_text_atomic(folder / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    write_text_atomic(folder / "outputs.jsonl", "".join(
        json.dumps(output_row(o)) + "\n" for o in result["outputs"]))


def render_status(status: dict):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"switch {status['switch']}: {status['flows']} flows, replication "
                        f"{'on' if status['replication'] else 'off'}")
    for name in ("runtime", "live", "pid", "flows", "replicas", "un-acked", "processed"):
        table.add_column(name, justify="left" if name == "runtime" else "right")
    for name, r in status["runtimes"].items():
        table.add_row(name, "yes" if r["live"] else "no" if r["joined"] else "not joined",
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
                         f"({m['mode']}) in {m['completion_ms']:.1f} ms")
    return Group(table, Text("\n".join(lines))) if lines else table


def render_bench(result: dict):
    from rich.console import Group
    from rich.table import Table

    rates = Table(title=f"{result['packets']} packets, {result['runtimes']} runtimes")
    for name in ("replication", "packets/s", "per runtime", "p50 us", "p99 us"):
        rates.add_column(name, justify="left" if name == "replication" else "right")
    for key, label in (("no_replication", "off"), ("replication", "on")):
        t, lat = result["throughput"][key], result["latency_us"][key]
        rates.add_row(label, f"{t['packets_per_s']:.0f}", f"{t['per_runtime']:.0f}",
                      f"{lat['p50']:.0f}", f"{lat['p99']:.0f}")
    added = result["latency_us"].get("added")
    if added is not None:
        p99 = added["p99"]
        rates.caption = (f"replication adds {p99['median']:.0f} us at p99 (median of "
                         f"{len(result['latency_us']['replication']['runs'])} pairs, "
                         f"{p99['min']:.0f} to {p99['max']:.0f}) at "
                         f"{result['latency_rate_pps']:.0f} packets/s")
    moves = Table(title="migration completion")
    for name in ("flows", "actor ms", "central ms", "central / actor"):
        moves.add_column(name, justify="right")
    times = {(m["flows"], m["mode"]): m["completion_ms"] for m in result["migration"]}
    for n in sorted({n for n, _ in times}):
        a, c = times.get((n, "actor")), times.get((n, "central"))
        moves.add_row(str(n), f"{a:.1f}", f"{c:.1f}", f"{c / a:.1f}x")
    parts = [rates, moves]
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
        parts.append(f"recovery not measured: {result['recovery_skipped']}")
    return Group(*parts)
