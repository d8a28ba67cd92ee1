"""NFVactor's measurements: throughput, latency, migration time, recovery time.

``bench`` runs against the live runtimes of one running cluster (two at least; a
cluster that lost a runtime is measured on the rest):

* **throughput**: the trace replayed as fast as a window of outstanding packets allows,
  with replication on and off; packets/s in all and per runtime (all / runtimes);
* **latency**: the trace's first packets (2,000) at a fixed rate far below saturation
  (1,000 packets/s, one packet a message), with replication off and on in turn, five
  pairs of runs: p50/p99 of send-to-output time per packet, the median over the runs,
  and the added latency of output commit as the on-minus-off difference of each pair
  (median, least and most: the spread says how much of it is scheduling noise);
* **migration**: for each size N, N idle flows per runtime (so the first holds N),
  then N of them moved from the first live runtime to the second, in actor and in
  central mode, three times each, the modes in turn; completion time from the switch's
  command to the last flow's confirmation, the median of the three; ``speedup`` is
  central over actor at the size nearest 500 flows;
* **recovery** (last, as it kills a runtime): kill -9 of the third live runtime midway
  through a replay; detection (silence until declared dead) and takeover (declaration
  until every affected flow has committed what was outstanding and has a new replica).
  It needs three live runtimes (two remain to take over), and is skipped with a note
  (``recovery_skipped``) otherwise.

Every replay's outputs are checked against the first run's (and a failure is
``DlNfvError``), so the figures are of runs that lost and duplicated nothing.
"""

from __future__ import annotations

import numpy as np

from dl_nfv.artifacts.errors import DlNfvError

from .client import Action, migrate, replay, status
from .cluster import ClusterSpec
from .traffic import interleaved

GOAL_FLOWS = 500  # the size the migration goal is stated at (``speedup``)


def _checked(result: dict, reference: str | None, what: str) -> dict:
    if (result["lost"], result["duplicates"], result["reordered"]) != (0, 0, 0) or (
            reference is not None and result["digest"] != reference):
        raise DlNfvError(f"{what}: outputs differ from the fault-free run (lost "
                         f"{result['lost']}, duplicated {result['duplicates']}, reordered "
                         f"{result['reordered']})")
    return result


def live_runtimes(spec: ClusterSpec) -> list[str]:
    """The runtimes the switch holds live now, or restarted and live from the next load
    (the bench's first replay), in the cluster file's order."""
    runtimes = status(spec)["runtimes"]
    return [name for name in spec.runtime_names
            if runtimes[name]["live"] or runtimes[name]["standby"]]


def bench(spec: ClusterSpec, packets: list, chain: dict, *, sizes: tuple[int, ...] = (100, 500,
                                                                                      2000),
          latency_rate_pps: float = 1000, latency_packets: int = 2000, latency_repeats: int = 5,
          repeats: int = 1, migration_repeats: int = 3, recovery: bool = True) -> dict:
    """The measurements of the module docstring, as plain data, on the runtimes that are
    live now (a cluster that lost a runtime is measured on the rest)."""
    live = live_runtimes(spec)
    if len(live) < 2:
        raise DlNfvError(f"the bench needs 2 live runtimes or more, the cluster has "
                         f"{len(live)} ({', '.join(live) or 'none'})")
    first, second = live[:2]
    runtimes = len(live)
    reference = None
    throughput = {}
    for replication in (False, True):
        key = "replication" if replication else "no_replication"
        best = None
        for _ in range(repeats):
            run = _checked(replay(spec, packets, chain, replication=replication, window=4096),
                           reference, f"throughput run ({key})")
            reference = reference or run["digest"]
            best = run if best is None or run["packets_per_s"] > best["packets_per_s"] else best
        ran = sum(r["live"] for r in best["status"]["runtimes"].values())
        throughput[key] = {"packets_per_s": best["packets_per_s"],
                           "per_runtime": best["packets_per_s"] / ran}
    latency = _latency(spec, packets[:latency_packets], chain, latency_rate_pps,
                       latency_repeats)
    migration = _migrations(spec, chain, sizes, first, second, migration_repeats)
    ratios = speedups({"migration": migration})
    goal = min(ratios, key=lambda n: abs(n - GOAL_FLOWS))
    result = {"kind": "actors-bench", "speedup": ratios[goal], "speedup_flows": goal,
              "packets": len(packets), "runtimes": runtimes, "live": live,
              "throughput": throughput, "latency_us": latency,
              "latency_rate_pps": latency_rate_pps,
              "latency_packets": min(latency_packets, len(packets)), "migration": migration}
    if not recovery:
        return result
    if len(live) < 3:
        result["recovery_skipped"] = (f"recovery needs a third live runtime to kill (and two "
                                      f"to take over), the cluster has {len(live)}")
        return result
    victim = live[2]
    run = _checked(replay(spec, packets, chain, rate_pps=max(len(packets) / 2, 100),
                          window=512, batch=8, actions=(Action(len(packets) // 2, "kill", victim),)),
                   reference, "recovery run")
    event = [e for e in run["status"]["events"] if e.get("runtime") == victim][-1]
    result["recovery"] = {"runtime": victim, "detection_ms": event["detection_ms"],
                          "takeover_ms": event["takeover_ms"],
                          "flows_promoted": event["promoted"],
                          "flows_rereplicated": event["rereplicated"],
                          "heartbeat_timeout_ms": spec.heartbeat_timeout_ms}
    return result


def _latency(spec: ClusterSpec, packets: list, chain: dict, rate_pps: float,
             repeats: int) -> dict:
    """Send-to-output latency of ``packets`` at ``rate_pps``, one packet a message, with
    replication off and on in turn, ``repeats`` pairs: per setting the median over the runs
    of each run's p50 and p99 (and every run's), and ``added``: replication on minus off
    per pair, its median, least and most."""
    runs: dict[str, list] = {"no_replication": [], "replication": []}
    reference = None
    for _ in range(repeats):
        for replication in (False, True):
            key = "replication" if replication else "no_replication"
            run = _checked(replay(spec, packets, chain, replication=replication,
                                  rate_pps=rate_pps, batch=1), reference, f"latency run ({key})")
            reference = reference or run["digest"]
            runs[key].append(run["latency_us"])
    result: dict = {}
    for key, got in runs.items():
        result[key] = {q: float(np.median([r[q] for r in got])) for q in ("p50", "p99")}
        result[key]["runs"] = [{q: r[q] for q in ("p50", "p99")} for r in got]
    added = {}
    for q in ("p50", "p99"):
        diffs = [on[q] - off[q] for on, off in zip(runs["replication"], runs["no_replication"])]
        added[q] = {"median": float(np.median(diffs)), "min": min(diffs), "max": max(diffs)}
    result["added"] = added
    return result


def _migrations(spec: ClusterSpec, chain: dict, sizes: tuple[int, ...], source: str,
                destination: str, repeats: int) -> list[dict]:
    """Per size and mode, ``repeats`` migrations, each of freshly replayed flows (N per
    runtime of the cluster file, so the source holds N or more however many are live),
    the modes in turn: the median completion time, and every run's."""
    migration = []
    for size in sizes:
        flows = interleaved(size * len(spec.runtimes), 3, seed=size)
        runs: dict[str, list[float]] = {"actor": [], "central": []}
        for _ in range(repeats):
            for mode in runs:
                replay(spec, flows, chain, window=2048, batch=64)
                runs[mode].append(migrate(spec, size, source, destination,
                                          mode)["completion_ms"])
        migration += [{"flows": size, "mode": mode, "completion_ms": float(np.median(ms)),
                       "runs_ms": ms} for mode, ms in runs.items()]
    return migration


def speedups(result: dict) -> dict[int, float]:
    """Central over actor completion time, per migration size."""
    times = {(m["flows"], m["mode"]): m["completion_ms"] for m in result["migration"]}
    return {n: times[(n, "central")] / times[(n, "actor")]
            for n, mode in times if mode == "actor" and (n, "central") in times}
