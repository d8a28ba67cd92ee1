"""Stateful firewall: a 5-tuple ACL evaluated once per connection, then connection state.

A flow starts NEW. Its first message from the client (the side that opened
the connection) is checked against the ACL, first matching rule wins, else the
default action: ``allow`` makes the flow ESTABLISHED (every later message in
both directions passes), ``deny`` makes it DENIED (every later message is
dropped). A server message on a NEW flow has no connection and is dropped.
Rules match protocol, client/server address prefixes (IPv4 or IPv6) and
client/server port ranges. Dropped messages are not seen by later NFs.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from .base import GpuBatch, Outputs
from .lazy_torch import torch

NAME = "firewall"
NEW, ESTABLISHED, DENIED = 0, 1, 2
_MASK64 = (1 << 64) - 1


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_prefix(text: str) -> tuple[int, int]:
    """(network, mask) as 128-bit ints; IPv4 prefixes are mapped into ::ffff:0:0/96."""
    if text == "any":
        return 0, 0
    net = ipaddress.ip_network(text, strict=False)
    if net.version == 4:
        return (0xFFFF << 32) | int(net.network_address), ((1 << 128) - 1) ^ (
            (1 << (32 - net.prefixlen)) - 1)
    return int(net.network_address), int(net.netmask)


def parse_ports(text: str) -> tuple[int, int]:
    if text == "any":
        return 0, 65535
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


class Firewall:
    kind = NAME
    portable = True

    def __init__(self, spec, flows) -> None:
        self.flows = flows
        rules = []
        for r in spec.acl:
            proto = {"any": 0, "tcp": 6, "udp": 17}[r.proto]
            rules.append((proto, *parse_prefix(r.src), *parse_prefix(r.dst),
                          *parse_ports(r.src_port), *parse_ports(r.dst_port),
                          1 if r.action == "allow" else 0))
        self.rules = rules
        self.default = 1 if spec.default == "allow" else 0
        self.state = np.zeros(len(flows), dtype=np.int64)  # GPU-side connection states
        n = len(rules)
        cols = list(zip(*rules)) if rules else [()] * 11

        def as_pair(vals):
            return np.array([[_signed(v >> 64), _signed(v & _MASK64)] for v in vals],
                            dtype=np.int64).reshape(n, 2)

        self._t = {
            "proto": np.array(cols[0], dtype=np.int64),
            "src_net": as_pair(cols[1]), "src_mask": as_pair(cols[2]),
            "dst_net": as_pair(cols[3]), "dst_mask": as_pair(cols[4]),
            "sport": np.array(list(zip(cols[5], cols[6])), dtype=np.int64).reshape(n, 2),
            "dport": np.array(list(zip(cols[7], cols[8])), dtype=np.int64).reshape(n, 2),
            "action": np.array(cols[9], dtype=np.int64),
        }

    # CPU path -----------------------------------------------------------------
    def allowed(self, flow: int) -> bool:
        """First matching ACL rule's action for ``flow`` (client to server), else the default."""
        f = self.flows
        c = (int(f.client_addr[flow, 0]) & _MASK64) << 64 | (int(f.client_addr[flow, 1]) & _MASK64)
        s = (int(f.server_addr[flow, 0]) & _MASK64) << 64 | (int(f.server_addr[flow, 1]) & _MASK64)
        proto, cport, sport = int(f.proto[flow]), int(f.client_port[flow]), int(f.server_port[flow])
        for (p, snet, smask, dnet, dmask, splo, sphi, dplo, dphi, action) in self.rules:
            if ((p == 0 or p == proto) and c & smask == snet and s & dmask == dnet
                    and splo <= cport <= sphi and dplo <= sport <= dphi):
                return bool(action)
        return bool(self.default)

    def cpu_state(self, flow: int):
        return [NEW]

    def cpu(self, state, ctx, payload: bytes, out: Outputs) -> bool:
        s = state[0]
        if s == ESTABLISHED:
            return True
        if s == NEW and ctx.direction == 0:
            state[0] = ESTABLISHED if self.allowed(ctx.flow) else DENIED
            if state[0] == ESTABLISHED:
                return True
        out.drops.append((ctx.flow, ctx.index))
        return False

    def cpu_block(self, block, data, starts, alive, states, position, out: Outputs
                  ) -> np.ndarray:
        """``cpu`` over a whole block: each NEW flow decided once, at its first client
        message in the block; the messages that pass by array operations."""
        rows = np.flatnonzero(alive)
        if len(rows) == 0:
            return alive
        flow, client = block.flow[rows], block.direction[rows] == 0
        flows, inv = np.unique(flow, return_inverse=True)
        cells = [states[f][position] for f in flows.tolist()]
        state = np.array([c[0] for c in cells], dtype=np.int64)
        pos = np.arange(len(rows))
        first_client = np.full(len(flows), len(rows), dtype=np.int64)
        np.minimum.at(first_client, inv, np.where(client, pos, len(rows)))
        verdict = state.copy()
        for k in np.flatnonzero((state == NEW) & (first_client < len(rows))).tolist():
            verdict[k] = ESTABLISHED if self.allowed(int(flows[k])) else DENIED
        for cell, value in zip(cells, verdict.tolist()):
            cell[0] = value
        before = state[inv]
        passes = (before == ESTABLISHED) | ((before == NEW) & (pos >= first_client[inv])
                                            & (verdict[inv] == ESTABLISHED))
        dropped = rows[~passes]
        if len(dropped):
            out.add_chunk("drops", np.column_stack([block.flow[dropped], block.index[dropped]]))
        kept = alive.copy()
        kept[dropped] = False
        return kept

    def export_flow(self, state) -> int:
        return state[0]

    def import_flow(self, value: int):
        return [value]

    # GPU path -----------------------------------------------------------------
    def gpu_export(self, flow: int) -> int:
        return int(self.state[flow])

    def gpu_import(self, flow: int, value: int) -> None:
        self.state[flow] = value

    def _acl(self, flows: torch.Tensor, dev: torch.device) -> torch.Tensor:
        """Allow (1) / deny (0) per flow: [flows x rules] match matrix, first match wins."""
        f = self.flows
        t = {k: torch.from_numpy(v).to(dev) for k, v in self._t.items()}
        fl = flows.cpu().numpy()
        c = torch.from_numpy(f.client_addr[fl]).to(dev)[:, None, :]
        s = torch.from_numpy(f.server_addr[fl]).to(dev)[:, None, :]
        proto = torch.from_numpy(f.proto[fl]).to(dev)[:, None]
        cport = torch.from_numpy(f.client_port[fl]).to(dev)[:, None]
        sport = torch.from_numpy(f.server_port[fl]).to(dev)[:, None]
        match = (((t["proto"] == 0) | (t["proto"] == proto))
                 & ((c & t["src_mask"]) == t["src_net"]).all(-1)
                 & ((s & t["dst_mask"]) == t["dst_net"]).all(-1)
                 & (t["sport"][:, 0] <= cport) & (cport <= t["sport"][:, 1])
                 & (t["dport"][:, 0] <= sport) & (sport <= t["dport"][:, 1]))
        n = match.shape[0]
        match = torch.cat([match, torch.ones((n, 1), dtype=torch.bool, device=dev)], dim=1)
        actions = torch.cat([t["action"], torch.tensor([self.default], device=dev)])
        first = match.to(torch.int8).argmax(dim=1)
        return actions[first]

    def gpu(self, batch: GpuBatch, alive: torch.Tensor, out: Outputs) -> torch.Tensor:
        """Per-message verdicts for the whole share: segment-min of each flow's first
        client message, the ACL for flows still NEW, then the state update."""
        dev = batch.device
        n = batch.size
        if n == 0:
            return alive
        flow = torch.from_numpy(batch.flow).to(dev)
        uniq, inv = torch.unique_consecutive(flow, return_inverse=True)
        state = torch.from_numpy(self.state[uniq.cpu().numpy()]).to(dev)
        pos = torch.arange(n, device=dev)
        client = alive & (torch.from_numpy(batch.direction).to(dev) == 0)
        big = torch.full((uniq.numel(),), n, dtype=torch.int64, device=dev)
        first = big.scatter_reduce(0, inv, torch.where(client, pos, n), "amin")
        acl = torch.zeros_like(state)
        new = (state == NEW) & (first < n)
        if bool(new.any()):
            acl[new] = self._acl(uniq[new], dev)
        s_msg, f_msg, a_msg = state[inv], first[inv], acl[inv]
        ok = (s_msg == ESTABLISHED) | ((s_msg == NEW) & (pos >= f_msg) & (a_msg == 1))
        dropped = alive & ~ok
        new_state = torch.where(new, torch.where(acl == 1, ESTABLISHED, DENIED), state)
        self.state[uniq.cpu().numpy()] = new_state.cpu().numpy()
        idx = dropped.nonzero().squeeze(1).cpu().numpy()
        if len(idx):
            out.add_chunk("drops", np.stack([batch.flow[idx], batch.index[idx]], axis=1))
        return alive & ok
