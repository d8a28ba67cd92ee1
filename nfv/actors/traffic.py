"""Packets for exercising flow actors without a capture: many flows, all active at once.

``interleaved(flows, packets_per_flow, seed)`` makes ``flows`` TCP conversations between
10.1.0.0/16 clients (every seventh from 10.0.1.0/24, which the example firewall denies)
and 10.2.0.0/16 servers on port 80, and interleaves their packets in a seeded random
order that keeps each flow's own order (the handshake, data both ways, a FIN from each
side), so that every flow has packets throughout the run: the traffic a migration or a
failure meets midway.
"""

from __future__ import annotations

import random

from .chain import ActorPacket

SYN, FIN, ACK, PSH = 0x02, 0x01, 0x10, 0x08


def interleaved(flows: int, packets_per_flow: int, seed: int = 0) -> list[ActorPacket]:
    """``flows * packets_per_flow`` packets (module docstring); ids in send order."""
    rng = random.Random(seed)
    lanes = []
    for flow in range(flows):
        client = bytes((10, 0, 1, flow & 255) if flow % 7 == 6
                       else (10, 1, flow >> 8 & 255, flow & 255))
        server = bytes((10, 2, flow % 7, 1 + flow % 200))
        port = 20_000 + flow % 40_000
        lane = []
        for k in range(packets_per_flow):
            to_server = k % 2 == 0
            flags = (SYN if k == 0 else SYN | ACK if k == 1 else ACK if k == 2
                     else FIN | ACK if k >= packets_per_flow - 2 else ACK | PSH)
            length = 0 if k < 3 else rng.randrange(0, 1460)
            src, sport, dst, dport = ((client, port, server, 80) if to_server
                                      else (server, 80, client, port))
            lane.append((src, sport, dst, dport, flags, length))
        lanes.append(lane)
    order = [flow for flow in range(flows) for _ in range(packets_per_flow)]
    rng.shuffle(order)
    position = [0] * flows
    packets = []
    for ts, flow in enumerate(order):
        src, sport, dst, dport, flags, length = lanes[flow][position[flow]]
        position[flow] += 1
        packets.append(ActorPacket(len(packets), 1_000_000 + 10 * ts, 6, src, sport, dst, dport,
                                   flags, length, 54 + length))
    return packets
