"""The firewall's connection machine and the next NF's session machine, scanned as one.

In a chain where a session NF (NAT, LB) follows the firewall, both machines step
over the same flow-sorted packets: the session machine over those the firewall
passes. Their product is one machine — state ``conn * W_s + session``; a packet
steps the connection part by the firewall's table and the session part by the
session table where the firewall passes it (its class row in both tables: the
session machine ignores the ACL bit), else leaves it — so one ``fsm_scan`` over
the firewall's packets gives both NFs' states, and the session NF's packets (the
firewall's survivors, ``engine._compact``) take theirs from it instead of scanning
again. The product has W_c * W_s states (15 * 11); its table is built once.

The joint scan runs where no packet can find either machine's flow timed out
(the scan then skips the time-out checks, as ``fsm_scan`` does on such batches):
the batch's time span under both machines' shortest time-outs, and its latest
packet's distance to each NF's last-seen time of every flow it keeps under that
NF's — a bound on every gap either NF can see, whichever packets the firewall
drops.
Elsewhere each NF scans its own packets. The result is the same either way:
packet by packet, a product state's parts are the two machines' states.
"""

from __future__ import annotations

import torch

from .ops import arrays, on_host, take, tensor
from .scan import fragile_states, fsm_scan, quiet_rows

JOINT = ("session", "joint")  # Sub.memo key of the session part of a joint scan


class JointScan:
    """The product of ``conn`` (a firewall kernel) and ``session`` (the session kernel right
    after it) and its scan."""

    def __init__(self, conn, session, data_rows):
        self.conn, self.session = conn, session
        w_c, w_s = conn.next.shape[1], session.next.shape[1]
        self.width = w_s
        c = torch.arange(w_c, device=conn.next.device).repeat_interleave(w_s)
        s = torch.arange(w_s, device=conn.next.device).repeat(w_c)
        passes = conn.verdict[:, c] == 0
        self.next = conn.next[:, c] * w_s + torch.where(passes, session.next[:, s], s)
        self.verdict = conn.verdict[:, c]  # the firewall's, by product state
        self.parts = (c, s)  # a product state's connection and session parts, by table
        self.quiet = quiet_rows(self.next, data_rows)
        self.fragile = fragile_states(self.next, self.quiet)
        self.conn_min = int(conn.timeouts[1:].min())
        self.session_min = int(session.timeouts[1:].min())

    def run(self, sub, cls, existed):
        """(found, after) of the product machine over ``sub``'s packets (``cls``: the
        firewall's rows, ``existed``: the flows it keeps; the connection part of a state by
        ``parts[0]``, the firewall's verdict by ``verdict``), the session machine's parts left
        in ``sub.memo[JOINT]``; None where a time-out is possible (no memo then)."""
        seg = sub.seg
        if seg.count == 0:
            return None
        host = on_host(sub.ts)  # by numpy over the same memory: its calls cost less
        ts, conn_last, session_last, conn_kept, session_kept = arrays(
            host, sub.ts, self.conn._column(sub, "last"), self.session._column(sub, "last"),
            existed, self.session._flows(sub))
        lo, hi = int(ts.min()), int(ts.max())
        # every gap either NF can see is at most the batch's span, or, at a flow's first
        # packet it sees, the latest packet's distance to the NF's last-seen time
        if hi - lo > min(self.conn_min, self.session_min) \
                or int(((hi - conn_last) * conn_kept).max()) > self.conn_min \
                or int(((hi - session_last) * session_kept).max()) > self.session_min:
            return None
        conn_s0, session_s0 = arrays(host, self.conn._column(sub, "state"),
                                     self.session._column(sub, "state"))
        s0 = tensor(conn_s0 * self.width + session_s0)
        found, after, timed_out = fsm_scan(self.next, None, cls, None, seg, s0, self.quiet,
                                           self.fragile)
        # the session parts by gathers from 165 entries, not integer divisions (by numpy over
        # the same memory on a CPU: its calls cost less)
        session_of, found_, after_ = arrays(on_host(found), self.parts[1], found, after)
        sub.memo[JOINT] = (tensor(take(session_of, found_)), tensor(take(session_of, after_)),
                           timed_out)
        return found, after


def carry(memo: dict, kept) -> dict:
    """The joint scan's session parts for the packets ``kept`` (positions), for the ``Sub``
    of the firewall's survivors; nothing else of ``memo`` holds there."""
    got = memo.get(JOINT)
    return {} if got is None else {JOINT: tuple(take(t, kept) for t in got)}


__all__ = ["JOINT", "JointScan", "carry"]
