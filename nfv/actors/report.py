"""What ``dl-nfv nfv actors replay`` writes: what the chain produced (``report.json``,
``outputs.jsonl``) and how the run went (``--stats``); ``cli/render_actors.py`` shows
them."""

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
