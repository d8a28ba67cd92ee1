"""Talking to a running NFVactor cluster: replay a trace, migrate, fail, status.

``replay`` loads a chain into every runtime, sends the packets to the switch (at a
rate, or as fast as a window of outstanding packets allows), receives every packet's
output, and at the end collects every flow's final NF state. Things to do mid-replay
(``Action``: kill -9 or stop a runtime, migrate flows) happen when a given number of
outputs has come back, so a run can be repeated exactly. The result holds the outputs
sorted by packet, the final states, counters, per-packet latency percentiles (send to
output, on this process's clock) and checks: packets lost, duplicated, reordered
within a flow.
"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dl_nfv.artifacts.errors import BadInput, DlNfvError

from .chain import ActorPacket, Output
from .cluster import ClusterSpec, is_local
from .wire import Endpoint

REPLY_TIMEOUT_S = 3.0


def read_packets(path: str | Path) -> list[ActorPacket]:
    """The TCP/UDP packets of a pcap/pcapng file, in capture order (the shared reader)."""
    from dl_nfv.nfv.traffic.columnar import read_columns
    from dl_nfv.nfv.traffic.pcap import MalformedCounts

    columns = read_columns(path, MalformedCounts())
    return [ActorPacket(i, p.ts_us, p.proto, p.src, p.sport, p.dst, p.dport, p.flags,
                        len(p.payload), p.wire_bytes) for i, p in enumerate(columns.packets())]


@dataclass(frozen=True, slots=True)
class Action:
    """Something to do once ``after_outputs`` outputs have come back: ``kill`` (SIGKILL)
    or ``stop`` (SIGSTOP) ``runtime``, or ``migrate`` ``flows`` flows from ``runtime`` to
    ``destination`` in ``mode`` (actor or central)."""

    after_outputs: int
    kind: str
    runtime: str
    destination: str = ""
    flows: int = 0
    mode: str = "actor"


def connect(spec: ClusterSpec) -> tuple[Endpoint, dict]:
    """An endpoint for this process and the switch's status; ``BadInput`` if it is down."""
    endpoint = Endpoint(f"client-{os.getpid()}-{time.monotonic_ns()}")
    try:
        status = endpoint.request(spec.switch.endpoint, "hello", endpoint.address, "hello",
                                  REPLY_TIMEOUT_S,
                                  f"the switch {spec.switch.name!r} at {spec.switch.address}")
    except BaseException:
        endpoint.close()
        raise
    return endpoint, status


def status(spec: ClusterSpec) -> dict:
    endpoint, result = connect(spec)
    endpoint.close()
    return result


def runtime_of(spec: ClusterSpec, name: str):
    """The runtime ``name`` of the cluster file; ``BadInput`` for the switch or no runtime."""
    member = spec.member(name)
    if member is spec.switch:
        raise BadInput(f"{name!r} is the cluster's switch, not a runtime")
    return member


def signal_runtime(spec: ClusterSpec, runtime: str, status: dict, sig: int) -> int:
    """Send ``sig`` to ``runtime``'s process (it must run on this machine); its pid."""
    member = spec.member(runtime)
    view = status["runtimes"].get(runtime)
    if view is None or not view["live"]:
        raise BadInput(f"runtime {runtime!r} is not live")
    if not is_local(member):
        raise BadInput(f"runtime {runtime!r} runs on {member.host}, not on this machine")
    os.kill(view["pid"], sig)
    return view["pid"]


def fail(spec: ClusterSpec, runtime: str, wait_s: float = 10.0) -> dict:
    """kill -9 ``runtime`` and wait up to ``wait_s`` for the switch to declare it dead and
    finish the takeover; the switch's event for it (detection and takeover times)."""
    runtime_of(spec, runtime)
    endpoint, before = connect(spec)
    try:
        pid = signal_runtime(spec, runtime, before, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            now = endpoint.request(spec.switch.endpoint, "status", endpoint.address, "status",
                                   REPLY_TIMEOUT_S, f"the switch {spec.switch.name!r}")
            events = [e for e in now["events"] if e.get("runtime") == runtime]
            if events and events[-1]["takeover_ms"] is not None:
                return {"runtime": runtime, "pid": pid, **events[-1]}
            time.sleep(0.05)
        return {"runtime": runtime, "pid": pid, "takeover_ms": None}
    finally:
        endpoint.close()


def migrate(spec: ClusterSpec, flows: int, source: str, destination: str, mode: str,
            timeout_s: float = 60.0) -> dict:
    """Move ``flows`` flows from ``source`` to ``destination``; the completion time.

    The names are checked against the cluster file before the switch is asked; a runtime
    of the migration that dies meanwhile is ``DlNfvError`` (its flows were taken over)."""
    runtime_of(spec, source)
    runtime_of(spec, destination)
    if source == destination:
        raise BadInput(f"the flows are on {source!r} already: --from and --to name the same runtime")
    endpoint, _ = connect(spec)
    try:
        endpoint.send(spec.switch.endpoint, "migrate", {
            "reply": endpoint.address, "flows": flows, "source": source,
            "destination": destination, "mode": mode})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for kind, _, payload in endpoint.receive(0.1):
                if kind == "migrate_error":
                    raise BadInput(payload)
                if kind == "migrated":
                    if "failed" in payload:
                        raise DlNfvError(f"migration of {flows} flows {source} -> "
                                         f"{destination} failed: {payload['failed']}")
                    return payload
        raise DlNfvError(f"migration of {flows} flows did not finish in {timeout_s:g} s")
    finally:
        endpoint.close()


@dataclass(slots=True)
class _Run:
    """What a replay has seen so far."""

    sent_at: np.ndarray
    latency_s: np.ndarray
    outputs: dict = field(default_factory=dict)
    last_by_flow: dict = field(default_factory=dict)
    duplicates: int = 0
    reordered: int = 0
    migrations: list = field(default_factory=list)
    actions: list = field(default_factory=list)

    def take(self, batch: list, now: float) -> None:
        for output in batch:
            if output.packet in self.outputs:
                self.duplicates += 1
                continue
            self.outputs[output.packet] = output
            self.latency_s[output.packet] = now - self.sent_at[output.packet]
            if self.last_by_flow.get(output.flow, -1) > output.packet:
                self.reordered += 1
            self.last_by_flow[output.flow] = output.packet


def replay(spec: ClusterSpec, packets: list[ActorPacket], chain: dict, *, rate_pps: float = 0,
           window: int = 2048, batch: int = 64, replication: bool | None = None,
           actions: tuple[Action, ...] = (), stall_s: float = 20.0) -> dict:
    """Replay ``packets`` through the cluster (module docstring); the result."""
    endpoint, first = connect(spec)
    try:
        endpoint.request(spec.switch.endpoint, "load", (endpoint.address, chain, replication),
                         "loaded", REPLY_TIMEOUT_S * 4, f"the switch {spec.switch.name!r}")
        run = _Run(sent_at=np.zeros(len(packets)), latency_s=np.full(len(packets), np.nan))
        collecting = gc.isenabled()
        gc.collect()
        gc.disable()  # no collector pass stamps a pause onto the outputs it delays
        try:
            wall_s = _stream(endpoint, spec, packets, run, rate_pps, window, batch,
                             list(actions), first, stall_s)
        finally:
            if collecting:
                gc.enable()
        _await_takeovers(endpoint, spec, [a.runtime for a in actions if a.kind != "migrate"],
                         stall_s)
        final = endpoint.request(spec.switch.endpoint, "dump", endpoint.address, "dump",
                                 REPLY_TIMEOUT_S * 4, f"the switch {spec.switch.name!r}")
    finally:
        endpoint.close()
    return _result(packets, run, final, wall_s)


def _stream(endpoint: Endpoint, spec: ClusterSpec, packets: list, run: _Run, rate_pps: float,
            window: int, batch: int, actions: list, status: dict, stall_s: float) -> float:
    """Send every packet and receive every output; the wall time it took."""
    switch = spec.switch.endpoint
    total, sent = len(packets), 0
    start = last_progress = time.perf_counter()
    actions.sort(key=lambda a: a.after_outputs)
    while len(run.outputs) < total:
        now = time.perf_counter()
        due = total if rate_pps <= 0 else min(total, int((now - start) * rate_pps) + 1)
        room = window - (sent - len(run.outputs))
        count = min(due - sent, room, batch)
        if count > 0:
            run.sent_at[sent:sent + count] = now
            endpoint.send(switch, "packets", packets[sent:sent + count])
            sent += count
        open_ = sent < total and sent - len(run.outputs) < window  # room for the next
        if count > 0 and sent < due and open_:
            wait = 0.0  # more is due already
        elif rate_pps > 0 and open_:  # asleep until the next packet is due, or an output
            wait = max(0.0, start + sent / rate_pps - time.perf_counter())
        else:
            wait = 0.002  # until outputs come (all sent, or the window full)
        for kind, _, payload in endpoint.receive(wait, exact=rate_pps > 0):
            if kind == "outputs":
                run.take(payload, time.perf_counter())
                last_progress = time.perf_counter()
            elif kind == "migrated":
                run.migrations.append(payload)
            elif kind == "migrate_error":
                raise BadInput(payload)
        while actions and len(run.outputs) >= actions[0].after_outputs:
            _act(endpoint, spec, actions.pop(0), status, run)
        if time.perf_counter() - last_progress > stall_s:
            raise DlNfvError(f"replay stalled: {len(run.outputs)} of {total} outputs after "
                             f"{stall_s:g} s without progress (is the switch "
                             f"{spec.switch.name!r} alive?)")
    return time.perf_counter() - start


def _await_takeovers(endpoint: Endpoint, spec: ClusterSpec, runtimes: list[str],
                     timeout_s: float) -> None:
    """Wait until the switch has declared each runtime killed or stopped dead and
    finished taking its flows over, so that the final states are the primaries'."""
    deadline = time.monotonic() + timeout_s
    while runtimes and time.monotonic() < deadline:
        now = endpoint.request(spec.switch.endpoint, "status", endpoint.address, "status",
                               REPLY_TIMEOUT_S, f"the switch {spec.switch.name!r}")
        done = {e["runtime"] for e in now["events"]
                if "runtime" in e and e["takeover_ms"] is not None}
        runtimes = [r for r in runtimes if r not in done]
        if runtimes:
            time.sleep(0.02)
    if runtimes:
        raise DlNfvError(f"the switch did not take over from {', '.join(runtimes)} in "
                         f"{timeout_s:g} s")


def _act(endpoint: Endpoint, spec: ClusterSpec, action: Action, status: dict, run: _Run) -> None:
    at = time.monotonic()
    if action.kind in ("kill", "stop"):
        sig = signal.SIGKILL if action.kind == "kill" else signal.SIGSTOP
        signal_runtime(spec, action.runtime, status, sig)
    elif action.kind == "migrate":
        endpoint.send(spec.switch.endpoint, "migrate", {
            "reply": endpoint.address, "flows": action.flows, "source": action.runtime,
            "destination": action.destination, "mode": action.mode})
    else:
        raise BadInput(f"unknown action {action.kind!r}: kill, stop or migrate")
    run.actions.append({"kind": action.kind, "runtime": action.runtime, "at": at,
                        "after_outputs": len(run.outputs)})


def _result(packets: list, run: _Run, final: dict, wall_s: float) -> dict:
    outputs = [run.outputs[i] for i in sorted(run.outputs)]
    states = dict(sorted(final["flows"].items()))
    dropped = Counter(o.dropped_by for o in outputs if o.dropped_by)
    latency_us = run.latency_s[~np.isnan(run.latency_s)] * 1e6
    pct = {f"p{q}": float(np.percentile(latency_us, q)) if len(latency_us) else 0.0
           for q in (50, 90, 99)}
    return {
        "packets": len(packets), "outputs": outputs, "states": states,
        "counters": {"passed": sum(1 for o in outputs if not o.dropped_by),
                     "dropped": dict(sorted(dropped.items())), "flows": len(states),
                     "packets_in_states": sum(seq for seq, _ in states.values())},
        "lost": len(packets) - len(outputs), "duplicates": run.duplicates,
        "reordered": run.reordered, "wall_s": wall_s,
        "packets_per_s": len(packets) / wall_s if wall_s > 0 else 0.0,
        "latency_us": {**pct, "max": float(latency_us.max()) if len(latency_us) else 0.0},
        "replicas": dict(sorted(final["replicas"].items())),
        "digest": digest(outputs, states), "migrations": run.migrations,
        "actions": run.actions, "status": final["status"]}


def digest(outputs: list[Output], states: dict) -> str:
    """sha256 over every output (packet order) and every flow's final state (flow order)."""
    h = hashlib.sha256()
    for output in outputs:
        h.update(repr(tuple(output)).encode())
    for flow, value in sorted(states.items()):
        h.update(repr((flow, value)).encode())
    return h.hexdigest()
