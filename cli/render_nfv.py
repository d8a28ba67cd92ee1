"""Rich rendering of NFV artifacts and summaries: nf-config, nfv-report, netstar-report,
netstar-bench, inspect."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.netstar import NetstarBench, NetstarReport
from dl_nfv.artifacts.nfconfig import NfConfig
from dl_nfv.artifacts.nfvreport import NfvReport

from .render_compare import gpu_note


def _flow(f) -> str:
    return f"{f.proto} {f.src}:{f.sport} -> {f.dst}:{f.dport}"


def render_config(config: NfConfig) -> Group:
    parts = []
    if config.chain or not config.l4_chain:
        parts.append(_l7_chain_table(config))
    if config.l4_chain:
        parts.append(_l4_chain_table(config))
    return Group(*parts)


def _l7_chain_table(config: NfConfig) -> Table:
    table = Table(title=f"nf-config {config.name}: engine {config.engine.name}, batch "
                        f"{config.engine.batch_size}", title_justify="left")
    for col in ("#", "nf", "parameters"):
        table.add_column(col)
    for i, spec in enumerate(config.chain):
        params = []
        if spec.rules:
            params.append(f"rules={spec.rules}")
        if spec.backends:
            params.append(f"backends={','.join(spec.backends)} policy={spec.policy.value}")
        if spec.nf.value == "firewall":
            params.append(f"{len(spec.acl)} ACL rules, default {spec.default.value}")
        table.add_row(str(i), spec.nf.value, " ".join(params) or "-")
    return table


def _l4_parameters(spec) -> str:
    """One line of what an L3/L4 NF of the chain is set to."""
    kind = spec.nf.value
    if kind == "firewall":
        return f"{len(spec.acl)} ACL rules, default {spec.default.value}"
    if kind == "nat":
        return f"pool {','.join(spec.pool)} ports {spec.ports}"
    if kind == "lb":
        return f"vip {spec.vip}, backends {','.join(spec.backends)}, Maglev table {spec.table_size}"
    if kind == "rate-limit":
        return f"{spec.rate_bytes_per_s} B/s per flow, burst {spec.burst_bytes} B"
    return "-"


def _l4_chain_table(config: NfConfig) -> Table:
    engine = config.l4_engine
    table = Table(title=f"nf-config {config.name}: l4_chain (nfv chain), engine {engine.name} "
                        f"on {engine.device}, batch {engine.batch_size}", title_justify="left")
    for col in ("#", "nf", "parameters"):
        table.add_column(col)
    for i, spec in enumerate(config.l4_chain):
        table.add_row(str(i), spec.nf.value, _l4_parameters(spec))
    return table


def render_report(report: NfvReport) -> Group:
    share = sum(b.gpu_messages for b in report.batches) / max(report.messages, 1)
    note = gpu_note(report.device, share)
    head = Table(title=f"nfv-report: {report.config} on {report.trace} with {report.engine} "
                       f"({report.device}, {report.workers} workers)"
                       + (f"; {note}" if note else ""), title_justify="left")
    for col in ("packets", "flows", "messages", "payload MB", "Gbps", "messages/s",
                "p50 us", "p99 us", "batches"):
        head.add_column(col, justify="right")
    head.add_row(str(report.packets), str(report.flows), str(report.messages),
                 f"{report.payload_bytes / 1e6:.1f}", f"{report.gbps:.3f}",
                 f"{report.messages_per_s:,.0f}", f"{report.latency.p50_us:,.0f}",
                 f"{report.latency.p99_us:,.0f}", str(len(report.batches)))
    parts = [head]
    if report.batches:
        split = Table(title="CPU/GPU split (first batches)", title_justify="left")
        for col in ("batch", "mode", "messages", "GPU flows", "GPU msgs", "CPU msgs", "GPU ms",
                    "CPU ms", "wall ms"):
            split.add_column(col, justify="right")
        for b in report.batches[:8]:
            split.add_row(str(b.index), b.mode, str(b.messages), f"{b.gpu_flows}/{b.flows}",
                          str(b.gpu_messages), str(b.cpu_messages), f"{b.gpu_ms:.1f}",
                          f"{b.cpu_ms:.1f}", f"{b.wall_ms:.1f}")
        split.caption = f"GPU path took {share:.0%} of messages" + (f" ({note})" if note else "")
        parts.append(split)
    if report.alerts:
        alerts = Table(title=f"alerts ({len(report.alerts)})", title_justify="left")
        for col in ("sid", "msg", "flow", "message"):
            alerts.add_column(col)
        for a in report.alerts[:20]:
            alerts.add_row(str(a.sid), a.msg, _flow(a.flow), str(a.message_index))
        parts.append(alerts)
    o = report.outputs
    nf = Table(title="NF outputs", title_justify="left")
    nf.add_column("nf")
    nf.add_column("summary")
    nf.add_column("digest")
    if o.monitor:
        nf.add_row("monitor", f"{o.monitor.flows} flows, {o.monitor.messages} messages, "
                              f"{o.monitor.packets} packets, {o.monitor.bytes} bytes",
                   o.monitor.digest[:12])
    if o.http:
        nf.add_row("http-lb", f"{o.http.requests} requests, {o.http.responses} responses; "
                              f"backends {o.http.backends}", o.http.digest[:12])
    if o.firewall:
        nf.add_row("firewall", f"{o.firewall.dropped_messages} messages dropped in "
                               f"{o.firewall.dropped_flows} flows", o.firewall.digest[:12])
    if o.ids:
        nf.add_row("ids", f"{o.ids.rules} rules, {o.ids.patterns} patterns, {o.ids.alerts} alerts,"
                          f" {o.ids.stride_bytes} bytes/step", o.ids.digest[:12])
    parts.append(nf)
    if report.malformed:
        parts.append(f"malformed/skipped: {report.malformed}")
    return Group(*parts)


def render_inspect(summary: dict) -> Group:
    head = Table(title=f"trace {summary['trace']}", title_justify="left")
    for col in ("packets", "flows", "messages", "payload MB", "applications"):
        head.add_column(col, justify="right")
    head.add_row(str(summary["packets"]), str(summary["flows"]), str(summary["messages"]),
                 f"{summary['payload_bytes'] / 1e6:.2f}",
                 ", ".join(f"{k} {v}" for k, v in summary["applications"].items()) or "-")
    sizes = Table(title="flow sizes", title_justify="left")
    for col in ("", "min", "median", "p99", "max", "top 1% share"):
        sizes.add_column(col, justify="right")
    for name in ("messages_per_flow", "bytes_per_flow"):
        s = summary[name]
        sizes.add_row(name.replace("_", " "), f"{s['min']:g}", f"{s['median']:g}",
                      f"{s['p99']:g}", f"{s['max']:g}", f"{s['top1pct_share']:.0%}")
    parts = [head, sizes]
    largest = Table(title="largest flows", title_justify="left")
    for col in ("flow", "messages", "bytes"):
        largest.add_column(col)
    for f in summary["largest_flows"]:
        largest.add_row(f"{f['proto']} {f['src']}:{f['sport']} -> {f['dst']}:{f['dport']}",
                        str(f["messages"]), str(f["bytes"]))
    parts.append(largest)
    bad = Table(title="malformed or skipped (by reason)", title_justify="left")
    bad.add_column("reason")
    bad.add_column("count", justify="right")
    for k, v in summary["malformed"].items():
        bad.add_row(k, str(v))
    if not summary["malformed"]:
        bad.add_row("none", "0")
    parts.append(bad)
    if summary["tcp"]:
        parts.append("TCP reassembly: " + ", ".join(f"{k[4:]} {v}" for k, v in
                                                    summary["tcp"].items()))
    return Group(*parts)


def render_netstar_report(report: NetstarReport) -> Group:
    head = Table(title=f"{report.config} over {report.trace} ({report.style} style, store "
                       f"{report.store}{', DNS ' + report.dns if report.dns else ''}): "
                       f"{report.flows} flows, {report.messages} messages, "
                       f"{report.messages_per_s:,.0f} messages/s", title_justify="left")
    for col in ("NF", "messages", "alerts", "dropped messages", "dropped flows", "notes"):
        head.add_column(col, justify="left" if col == "NF" else "right")
    for name, o in report.outputs.items():
        head.add_row(name, str(o.messages), str(o.alerts), str(o.dropped_messages),
                     str(o.dropped_flows), str(len(o.notes)))
    services = Table(title="external services", title_justify="left")
    for col in ("service", "requests", "retries", "cache hits", "held requests", "held flows",
                "peak outstanding"):
        services.add_column(col, justify="left" if col == "service" else "right")
    for name, s in report.services.items():
        services.add_row(name, str(s.requests), str(s.retries), str(s.cache_hits),
                         str(s.held_requests), str(s.held_flows), str(s.peak_outstanding))
    alerts = Table(title=f"alerts ({len(report.alerts)})", title_justify="left")
    for col in ("NF", "code", "message", "flow", "message #"):
        alerts.add_column(col, justify="right" if col == "message #" else "left")
    for a in report.alerts:
        alerts.add_row(a.nf, a.code, a.msg, _flow(a.flow), str(a.message_index))
    return Group(head, services, alerts)


def render_netstar_bench(bench: NetstarBench) -> Group:
    styles = list(bench.lines)
    speed = Table(title=f"{bench.config} over {bench.trace} ({bench.flows} flows, {bench.messages} "
                        f"messages, store {bench.store}); outputs identical: "
                        f"{bench.outputs_identical}", title_justify="left")
    speed.add_column("store latency ms", justify="right")
    for style in styles:
        speed.add_column(f"{style} messages/s", justify="right")
    for row in bench.throughput:
        speed.add_row(f"{row.store_latency_ms:g}",
                      *(f"{row.messages_per_s[s]:,.0f}" if s in row.messages_per_s else "-"
                        for s in styles))
    lines = Table(title="source lines per NF (no blanks, comments or docstrings)",
                  title_justify="left")
    lines.add_column("NF")
    for style in styles:
        lines.add_column(style, justify="right")
    for nf in bench.lines[styles[0]]:
        lines.add_row(nf, *(str(bench.lines[s].get(nf, "-")) for s in styles))
    return Group(speed, lines)
