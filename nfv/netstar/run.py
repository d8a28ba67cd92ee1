"""``nfv netstar run`` and ``bench``: config + trace + services -> report.

``run_netstar`` loads an ``nf-config`` whose chain holds NetStar NFs (``ids``,
``firewall``, ``nat``, ``malware``, ``url-filter``), reads the trace through
the traffic layer, connects to the store (``embedded`` or ``redis://``) and,
when an NF needs it, the DNS server, checks both answer (``BadInput`` naming
the address if not), runs the chain in the chosen style (``async``,
``callback`` or ``blocking``), deletes the run's keys and returns a
``netstar-report``. The report's outputs (alerts, drops, per-flow notes and
their digests) are the same for every style and store; timings and service
counters are not part of them.

``bench`` runs styles over one parsed trace at several store latencies and
checks that their outputs are identical; ``count_lines`` counts each NF's
lines of code per style with radon (source lines: blank lines, comments and
docstrings excluded; only the style's own function or class, not the logic
the styles share).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import math
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

from dl_nfv.artifacts.errors import BadInput, RuntimeFailure, UnknownName
from dl_nfv.artifacts.nfconfig import NfConfig

from ..run import load_config
from ..traffic.trace import Trace, load_trace
from . import nf_firewall, nf_ids, nf_malware, nf_nat, nf_urlfilter
from .dns import Dns, SyncDns, parse_dns
from .runtime import STYLES, AsyncRuntime, BlockingRuntime, CallbackRuntime, Outcome
from .services import RetryPolicy, ServiceStats
from .store import (
    EmbeddedStore,
    EmbeddedSyncStore,
    RedisStore,
    RedisSyncStore,
    StoreAddress,
    parse_store,
)

NF_MODULES = {m.NAME: m for m in (nf_ids, nf_firewall, nf_nat, nf_malware, nf_urlfilter)}
MAX_LISTED = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run: style, store address, DNS server, window, retry budget.

    ``store_latency_s`` (embedded store only): seconds each store request takes,
    or a function drawing it per request. ``record_order`` keeps the order in
    which NFs started messages (for tests); ``progress`` is called with the number of
    messages finished so far, after each.
    """

    style: str = "async"
    store: str = "embedded"
    dns: str | None = None
    store_latency_s: float | Callable[[], float] = 0.0
    window: int = 4096
    retry_budget_s: float = 30.0
    record_order: bool = False
    progress: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise UnknownName(f"--style: unknown style {self.style!r} "
                              f"(valid: {', '.join(STYLES)})")
        if self.window < 1:
            raise BadInput(f"window must be >= 1, got {self.window}")
        if not math.isfinite(self.retry_budget_s) or self.retry_budget_s < 0:
            raise BadInput(f"the retry budget must be a finite number of seconds >= 0, "
                           f"got {self.retry_budget_s}")


DEFAULT_OPTIONS = RunOptions()


@dataclasses.dataclass(slots=True)
class Env:
    """What an NF's code is given: the store, the DNS client, its shared logic."""

    store: object
    dns: object
    logic: object
    prefix: str

    def key(self, *parts) -> str:
        """A store key shared by all flows (``env.key("mhr", sha)``), in the run's namespace."""
        return self.prefix + ":".join(str(p) for p in parts)


@dataclasses.dataclass(slots=True)
class Stage:
    """One NF of the chain in every style."""

    name: str
    run: Callable
    env: Env
    callback: object = None
    blocking: object = None


def load_netstar_config(path: str | Path) -> NfConfig:
    """An ``nf-config`` whose chain holds only NetStar NFs (rules paths resolved)."""
    config = load_config(path)
    for spec in config.chain:
        if str(spec.nf) not in NF_MODULES:
            raise UnknownName(f"{path}: nf {spec.nf.value!r} has no NetStar version "
                              f"(NetStar NFs: {', '.join(NF_MODULES)})")
    return config


def _needs_dns(config: NfConfig) -> bool:
    return any(NF_MODULES[str(s.nf)].NEEDS_DNS for s in config.chain)


def run_netstar(config_path: str | Path, trace_path: str | Path | None,
                options: RunOptions = DEFAULT_OPTIONS, *, trace: Trace | None = None) -> dict:
    """Run the NetStar chain of ``config_path`` over the trace; the ``netstar-report``.

    Raises ``BadInput`` for a bad config, trace, store URL or DNS address, or a
    store/DNS server that does not answer at start; ``RuntimeFailure`` when a
    service stays unavailable past the retry budget mid-run.
    """
    report, _ = run_outcome(config_path, trace_path, options, trace=trace)
    return report


def run_outcome(config_path, trace_path, options: RunOptions = DEFAULT_OPTIONS, *,
                trace: Trace | None = None) -> tuple[dict, Outcome]:
    """``run_netstar``, also returning the raw ``Outcome`` (rows, order)."""
    config = load_netstar_config(config_path)
    address = parse_store(options.store)
    dns_address = parse_dns(options.dns) if options.dns else None
    if _needs_dns(config) and dns_address is None:
        needing = [s.nf.value for s in config.chain if NF_MODULES[str(s.nf)].NEEDS_DNS]
        raise BadInput(f"{config_path}: nf {', '.join(needing)} needs a DNS server (--dns HOST:PORT)")
    if trace is None:
        trace = load_trace(trace_path)
    logic = [NF_MODULES[str(s.nf)].Logic(s, trace) for s in config.chain]
    prefix = f"netstar:{uuid.uuid4().hex[:12]}:"
    stats = {"store": ServiceStats(), "dns": ServiceStats()}
    retry = RetryPolicy(budget_s=options.retry_budget_s)
    if options.style == "blocking":
        out = _run_blocking(config, trace, logic, prefix, address, dns_address, stats, retry,
                            options)
    else:
        out = asyncio.run(_run_loop(config, trace, logic, prefix, address, dns_address, stats,
                                    retry, options))
    return build_report(config, trace, options, address, dns_address, out, stats), out


def _chain(config, logic, store, dns, prefix: str, *, blocking: bool = False) -> list[Stage]:
    """Each NF of the chain with its environment, in the form the style's runtime calls."""
    chain = []
    for spec, lg in zip(config.chain, logic):
        module = NF_MODULES[str(spec.nf)]
        env = Env(store, dns, lg, prefix)
        if blocking:
            chain.append(Stage(module.NAME, module.run, env, blocking=module.Blocking(env)))
        else:
            chain.append(Stage(module.NAME, module.run, env, callback=module.Callback(env)))
    return chain


async def _run_loop(config, trace, logic, prefix, address: StoreAddress, dns_address, stats,
                    retry, options: RunOptions) -> Outcome:
    if address.backend == "embedded":
        store = EmbeddedStore(stats["store"], options.store_latency_s)
    else:
        store = RedisStore(address, stats["store"], retry)
    dns = Dns(*dns_address, stats["dns"], retry) if dns_address else None
    try:
        await store.check()
        if dns is not None:
            dns.check()
        chain = _chain(config, logic, store, dns, prefix)
        cls = AsyncRuntime if options.style == "async" else CallbackRuntime
        out = await cls(trace, chain, prefix, window=options.window,
                        record_order=options.record_order, progress=options.progress).run()
        await store.drop_namespace(prefix)
        return out
    finally:
        await store.close()
        if dns is not None:
            await dns.close()


def _run_blocking(config, trace, logic, prefix, address: StoreAddress, dns_address, stats, retry,
                  options: RunOptions) -> Outcome:
    if address.backend == "embedded":
        store = EmbeddedSyncStore(stats["store"], options.store_latency_s)
    else:
        store = RedisSyncStore(address, stats["store"], retry)
    dns = SyncDns(*dns_address, stats["dns"], retry) if dns_address else None
    try:
        store.check()
        if dns is not None:
            dns.check()
        chain = _chain(config, logic, store, dns, prefix, blocking=True)
        out = BlockingRuntime(trace, chain, prefix, record_order=options.record_order,
                              progress=options.progress).run()
        store.drop_namespace(prefix)
        return out
    finally:
        store.close()


def _digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def build_report(config: NfConfig, trace: Trace, options: RunOptions, address: StoreAddress,
                 dns_address, out: Outcome, stats: dict) -> dict:
    names = [str(s.nf) for s in config.chain]
    five = [f.five_tuple() for f in trace.flows]
    alerts = [{"nf": names[nf], "code": code, "msg": detail, "flow_id": f, "message_index": i,
               "flow": five[f]} for f, i, nf, code, detail in out.alerts]
    outputs = {}
    for pos, name in enumerate(names):
        a = [list(r) for r in out.alerts if r[2] == pos]
        d = [list(r) for r in out.drops if r[2] == pos]
        n = [list(r) for r in out.notes if r[1] == pos]
        part = {"messages": out.handled[pos], "alerts": len(a), "dropped_messages": len(d),
                "dropped_flows": len({r[0] for r in d}), "digest": _digest([a, d, n])}
        if n:
            part["notes"] = [{"flow_id": f, "flow": five[f], "value": v} for f, _, v in n[:MAX_LISTED]]
        outputs[name] = part
    elapsed = max(out.elapsed_s, 1e-9)
    return {
        "kind": "netstar-report", "schema_version": 1, "config": config.name,
        "trace": str(trace.source), "style": options.style, "store": address.url,
        "dns": f"{dns_address[0]}:{dns_address[1]}" if dns_address else None,
        "flows": out.flows, "messages": out.messages, "elapsed_s": round(out.elapsed_s, 6),
        "messages_per_s": out.messages / elapsed,
        "outputs_digest": _digest([[list(r) for r in out.alerts], [list(r) for r in out.drops],
                                   [list(r) for r in out.notes]]),
        "alerts": alerts, "outputs": outputs,
        "services": {name: s.as_dict() for name, s in stats.items()},
    }


# lines of code and the benchmark -----------------------------------------------------------------

def count_lines() -> dict[str, dict[str, int]]:
    """Source lines (radon's SLOC: no blanks, comments or docstrings) of each NF per style."""
    from radon.raw import analyze

    counts: dict[str, dict[str, int]] = {style: {"total": 0} for style in STYLES}
    for name, module in NF_MODULES.items():
        for style, obj in (("async", module.run), ("callback", module.Callback),
                           ("blocking", module.Blocking)):
            n = analyze(textwrap.dedent(inspect.getsource(obj))).sloc
            counts[style][name] = n
            counts[style]["total"] += n
    return counts


def bench(config_path: str | Path, trace: Trace, styles: list[str], latencies_ms: list[float],
          *, store: str = "embedded", dns: str | None = None, repeats: int = 3) -> dict:
    """Best-of-``repeats`` messages/s of each style at each store latency, outputs checked equal.

    With the embedded store the latency is modelled inside the store; with Redis
    (on 127.0.0.1) a loopback proxy (``servers.start_proxy``) adds it to every
    round trip. Raises ``RuntimeFailure`` if two styles' outputs differ.
    """
    for style in styles:
        RunOptions(style=style)
    address = parse_store(store)
    rows = []
    reference = None
    for latency in latencies_ms:
        row = {"store_latency_ms": latency, "messages_per_s": {}, "elapsed_s": {}}
        for style in styles:
            best = None
            for _ in range(max(1, repeats)):
                report = _bench_run(config_path, trace, style, latency, address, dns)
                if best is None or report["elapsed_s"] < best["elapsed_s"]:
                    best = report
            if reference is None:
                reference = (style, best["outputs_digest"])
            elif best["outputs_digest"] != reference[1]:
                raise RuntimeFailure(f"style {style} at {latency} ms produced different outputs "
                                     f"than {reference[0]}")
            row["messages_per_s"][style] = best["messages_per_s"]
            row["elapsed_s"][style] = best["elapsed_s"]
        rows.append(row)
    lines = count_lines()
    return {"kind": "netstar-bench", "schema_version": 1, "config": str(config_path),
            "trace": str(trace.source), "flows": len(trace.flows), "messages": trace.n_messages,
            "store": address.url, "outputs_identical": True,
            "lines": {s: lines[s] for s in STYLES}, "throughput": rows}


def _bench_run(config_path, trace, style, latency_ms, address: StoreAddress, dns) -> dict:
    if address.backend == "embedded":
        options = RunOptions(style=style, dns=dns, store_latency_s=latency_ms / 1000)
        return run_netstar(config_path, None, options, trace=trace)
    if not latency_ms:
        return run_netstar(config_path, None, RunOptions(style=style, store=address.url, dns=dns),
                           trace=trace)
    from .servers import LOOPBACK, start_proxy

    if address.host not in (LOOPBACK, "localhost"):
        raise BadInput(f"--store-latency-ms with Redis needs a server on {LOOPBACK}, "
                       f"not {address.host}")
    with start_proxy(address.port, latency_ms) as port:
        url = f"redis://{LOOPBACK}:{port}/{address.db}"
        return run_netstar(config_path, None, RunOptions(style=style, store=url, dns=dns),
                           trace=trace)
