"""NFVactor's measurements: throughput, latency, migration time, recovery time.

``bench`` runs, against one running cluster of at least three runtimes:

* **throughput**: the trace replayed as fast as a window of outstanding packets allows,
  with replication on and off; packets/s in all and per runtime (all / runtimes);
* **latency**: the trace at a fixed rate low enough not to queue, with replication on
  and off; p50/p99 of send-to-output time per packet (the added latency of output
  commit is the difference);
* **migration**: for each size N, 3N idle flows (so the first runtime holds N), then N
  of them moved from the first runtime to the second, in actor and in central mode;
  completion time from the switch's command to the last flow's confirmation;
* **recovery** (last, as it kills a runtime): kill -9 of the third runtime midway through
  a replay; detection (silence until declared dead) and takeover (declaration until
  every affected flow has committed what was outstanding and has a new replica).

Every replay's outputs are checked against the first run's (and a failure is
``DlNfvError``), so the figures are of runs that lost and duplicated nothing.
"""

from __future__ import annotations

from dl_nfv.artifacts.errors import DlNfvError

from .client import Action, migrate, replay
from .cluster import ClusterSpec
from .traffic import interleaved


def _checked(result: dict, reference: str | None, what: str) -> dict:
    if (result["lost"], result["duplicates"], result["reordered"]) != (0, 0, 0) or (
            reference is not None and result["digest"] != reference):
        raise DlNfvError(f"{what}: outputs differ from the fault-free run (lost "
                         f"{result['lost']}, duplicated {result['duplicates']}, reordered "
                         f"{result['reordered']})")
    return result


def bench(spec: ClusterSpec, packets: list, chain: dict, *, sizes: tuple[int, ...] = (100, 500,
                                                                                      2000),
          latency_rate_pps: float = 1000, repeats: int = 1, recovery: bool = True) -> dict:
    """The measurements of the module docstring, as plain data."""
    if len(spec.runtimes) < 3:
        raise DlNfvError(f"the bench needs 3 runtimes or more, the cluster has "
                         f"{len(spec.runtimes)}")
    first, second, third = spec.runtime_names[:3]
    runtimes = len(spec.runtimes)
    reference = None
    throughput, latency = {}, {}
    for replication in (False, True):
        key = "replication" if replication else "no_replication"
        best = None
        for _ in range(repeats):
            run = _checked(replay(spec, packets, chain, replication=replication, window=4096),
                           reference, f"throughput run ({key})")
            reference = reference or run["digest"]
            best = run if best is None or run["packets_per_s"] > best["packets_per_s"] else best
        throughput[key] = {"packets_per_s": best["packets_per_s"],
                           "per_runtime": best["packets_per_s"] / runtimes}
        run = _checked(replay(spec, packets, chain, replication=replication,
                              rate_pps=latency_rate_pps, batch=1), reference,
                       f"latency run ({key})")
        latency[key] = {k: run["latency_us"][k] for k in ("p50", "p99")}
    migration = []
    for size in sizes:
        flows = interleaved(size * runtimes, 3, seed=size)
        for mode in ("actor", "central"):
            replay(spec, flows, chain, window=2048, batch=64)
            done = migrate(spec, size, first, second, mode)
            migration.append({"flows": size, "mode": mode,
                              "completion_ms": done["completion_ms"]})
    result = {"packets": len(packets), "runtimes": runtimes, "throughput": throughput,
              "latency_us": latency, "latency_rate_pps": latency_rate_pps,
              "migration": migration}
    if recovery:
        run = _checked(replay(spec, packets, chain, rate_pps=max(len(packets) / 2, 100),
                              window=512, batch=8,
                              actions=(Action(len(packets) // 2, "kill", third),)),
                       reference, "recovery run")
        event = next(e for e in run["status"]["events"] if e.get("runtime") == third)
        result["recovery"] = {"runtime": third, "detection_ms": event["detection_ms"],
                              "takeover_ms": event["takeover_ms"],
                              "flows_promoted": event["promoted"],
                              "flows_rereplicated": event["rereplicated"],
                              "heartbeat_timeout_ms": spec.heartbeat_timeout_ms}
    return result


def speedups(result: dict) -> dict[int, float]:
    """Central over actor completion time, per migration size."""
    times = {(m["flows"], m["mode"]): m["completion_ms"] for m in result["migration"]}
    return {n: times[(n, "central")] / times[(n, "actor")]
            for n, mode in times if mode == "actor" and (n, "central") in times}
