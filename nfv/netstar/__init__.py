"""NetStar: network functions written with futures (async/await) over external services.

An NF keeps flow state in a key-value store (embedded, or a real Redis) and
asks a real DNS server, and is written as plain sequential code per flow
(``async for msg in flow.messages(): ... await env.store.get(key) ...``)
while every other flow progresses during each wait. ``runtime`` is the
async-flow interface over the traffic layer (and the callback and blocking
styles it is compared with), ``store`` and ``dns`` the services, ``nf_*`` the
NFs, ``run`` the command's library side, ``servers`` starts redis-server and
dnsmasq for tests and benchmarks.
"""

from .run import RunOptions, bench, count_lines, run_netstar

__all__ = ["RunOptions", "bench", "count_lines", "run_netstar"]
