"""IDS: multi-pattern matching of Snort-style rules over each flow's reassembled payload.

Patterns (``content``) are matched per direction as a continuous stream, so a
pattern split across two messages (or two batches) is found: the automaton
state of each direction is carried from message to message. A rule inspects
the directions its header and ``flow`` option select (``Rule.applies``: ``->``
means from the rule's source to its destination), and alerts once per flow, at
the first message where all of its contents have been seen in one such
direction's stream (in any order; contents seen only in the other direction do
not count).

CPU path: two literal matchers (one case-sensitive, one for ``nocase``
contents over lower-cased bytes) run over ``tail + message`` where ``tail`` is
the last ``max_len`` bytes of the direction's stream; a match counts when it
ends inside the message. The matchers are Hyperscan block-mode databases (the
engine Suricata uses), or ``ahocorasick-rs`` automata where the ``hyperscan``
package cannot load; both report every occurrence of every pattern, so the
alerts are the same. Hyperscan's streaming mode would carry the state itself,
but its state cannot be handed to the tensor path; the tail can
(``bench/nfv_bench.py --match`` times the three ways over reassembled messages).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

try:
    import hyperscan
except ImportError:  # no wheel for this platform: ahocorasick-rs finds the same matches
    hyperscan = None
from dl_nfv.artifacts.errors import RuntimeFailure

from .automaton import WORD_BITS, Automaton, Dfa, StrideTable
from .base import GpuBatch, Outputs, join_bytes
from .lazy_torch import torch
from .snort import Rule, load_rules

NAME = "ids"


class _Side:
    """One CPU matcher (case-sensitive, or nocase over lower-cased bytes) and its trie."""

    def __init__(self, patterns: list[bytes], first_pid: int, fold: bool):
        self.fold = fold
        self.first_pid = first_pid
        self.automaton = Automaton.build(patterns)
        self.max_len = self.automaton.max_len
        self.lengths = np.array([len(p) for p in patterns], dtype=np.int64)
        self.node_text = list(self.automaton.node_text)
        self.hs = _hyperscan_database(patterns) if hyperscan is not None else None
        self.matcher = None
        if self.hs is None:  # imported only here: most runs have hyperscan
            import ahocorasick_rs
            self.matcher = ahocorasick_rs.BytesAhoCorasick(patterns)

    def ending_after(self, hay: bytes, skip: int) -> list[int]:
        """Pattern ids of every occurrence in ``hay`` that ends after its first ``skip`` bytes."""
        if self.hs is None:
            return [pid for pid, _, end in self.matcher.find_matches_as_indexes(
                hay, overlapping=True) if end > skip]
        found: list[int] = []

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx) -> None:
            if end > skip:
                found.append(pid)

        self.hs.scan(hay, match_event_handler=on_match)
        return found

    def occurrences(self, hay: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(pattern ids, end offsets) of every occurrence of every pattern in ``hay``."""
        if self.hs is None:
            found = self.matcher.find_matches_as_indexes(hay, overlapping=True)
            pids = [m[0] for m in found]
            ends = [m[2] for m in found]
        else:
            pids, ends = [], []

            def on_match(pid: int, _start: int, end: int, _flags: int, _ctx) -> None:
                pids.append(pid)
                ends.append(end)

            self.hs.scan(hay, match_event_handler=on_match)
        return np.array(pids, dtype=np.int64), np.array(ends, dtype=np.int64)


def _kernels():
    """The TorchScript kernels, imported (and compiled) on the tensor path's first use."""
    from . import kernels

    return kernels


def _hyperscan_database(patterns: list[bytes]):
    """A block-mode Hyperscan database of ``patterns`` as literals, ids by position."""
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[b"".join(b"\\x%02x" % b for b in p) for p in patterns],
               ids=list(range(len(patterns))), elements=len(patterns),
               flags=[0] * len(patterns))
    return db


def _stream_ranges(key: np.ndarray, start: np.ndarray, length: np.ndarray
                   ) -> list[tuple[int, int, int]]:
    """The messages (grouped by stream ``key``, ``start`` in the buffer) as ranges of the
    buffer: consecutive messages of a stream that follow each other there (a clean flow's
    messages do) make one range. ``(stream, start, end)``, ``stream`` the stream's number
    on its first range and -1 on the others."""
    end = start + length
    new_stream = np.r_[True, key[1:] != key[:-1]]
    new_range = new_stream | np.r_[True, start[1:] != end[:-1]]
    firsts = np.flatnonzero(new_range)
    lasts = np.r_[firsts[1:] - 1, len(key) - 1]
    stream = np.where(new_stream[firsts], np.cumsum(new_stream)[firsts] - 1, -1)
    return list(zip(stream.tolist(), start[firsts].tolist(), end[lasts].tolist()))


SCAN_BYTES = 1 << 20  # message bytes of a block scanned at once (whole streams)


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Consecutive streams of a block scanned together: their ranges of the buffer
    (``_stream_ranges``' form, stream numbers of the block), their (flow, direction),
    the first one's number and where each lies among the block's messages back to
    back."""

    ranges: list[tuple[int, int, int]]
    owners: list[tuple[int, int]]
    first: int
    start: np.ndarray
    end: np.ndarray


def _chunks(sizes: list[int], limit: int) -> list[int]:
    """Bounds of runs of consecutive streams of ``sizes`` bytes, each run ``limit`` bytes at
    most unless one stream alone is more: ``[0, ..., len(sizes)]``."""
    bounds, total = [0], 0
    for i, size in enumerate(sizes):
        if total and total + size > limit:
            bounds.append(i)
            total = 0
        total += size
    bounds.append(len(sizes))
    return bounds


class Ids:
    kind = NAME
    portable = True

    def __init__(self, spec, flows, rules: tuple[Rule, ...] | None = None) -> None:
        self.rules = rules if rules is not None else load_rules(spec.rules)
        self.flows = flows
        keys: dict[tuple[bytes, bool], int] = {}
        for rule in self.rules:
            for c in rule.contents:
                key = (c.pattern.lower() if c.nocase else c.pattern, c.nocase)
                keys.setdefault(key, len(keys))
        cs = [k for k in keys if not k[1]]
        nc = [k for k in keys if k[1]]
        self.pid = {k: i for i, k in enumerate(cs + nc)}
        self.cs = _Side([k[0] for k in cs], 0, False) if cs else None
        self.nc = _Side([k[0] for k in nc], len(cs), True) if nc else None
        self.sides = [side for side in (self.cs, self.nc) if side is not None]
        self.rule_pids = [frozenset(self.pid[(c.pattern.lower() if c.nocase else c.pattern,
                                              c.nocase)] for c in r.contents) for r in self.rules]
        self.rules_of: list[list[int]] = [[] for _ in self.pid]
        for ri, pids in enumerate(self.rule_pids):
            for p in pids:
                self.rules_of[p].append(ri)
        n = len(flows)
        established = flows.established
        # applies[flow, direction, rule]: that direction's data is the rule's to inspect
        self.applies = np.zeros((n, 2, len(self.rules)), dtype=bool)
        for ri, rule in enumerate(self.rules):
            self.applies[:, :, ri] = rule.applies_all(flows.names, flows.client_port,
                                                      flows.server_port, established)
        self.watched = self.applies.any(axis=2)  # [flow, direction]
        self._dfa: Dfa | None = None
        self._table: StrideTable | None = None
        # GPU-side state: product-DFA state per (flow, direction); per flow and direction
        # the patterns seen (pattern -> message index)
        self.nodes = np.zeros((n, 2), dtype=np.int64)
        self.seen: dict[int, list[dict[int, int]]] = {}
        self._on: dict = {}
        self._classes: bytes | None = None

    # shared rule logic ---------------------------------------------------------
    def on_matches(self, seen: list[dict[int, int]], flow: int, direction: int, index: int,
                   pids, out: Outputs) -> None:
        """Record patterns first seen in ``direction`` at message ``index``; alert the rules
        that this completes in that direction (once per flow: not again for a rule that
        the other direction completed before)."""
        mine = seen[direction]
        new = [p for p in pids if p not in mine]
        if not new:
            return
        for p in new:
            mine[p] = index
        other = seen[1 - direction]
        fired = set()
        for p in new:
            for ri in self.rules_of[p]:
                if ri in fired or not self.applies[flow, direction, ri]:
                    continue
                need = self.rule_pids[ri]
                if not all(q in mine for q in need):
                    continue
                if self.applies[flow, 1 - direction, ri] and all(q in other for q in need):
                    continue
                fired.add(ri)
        for ri in sorted(fired):
            out.alerts.append((flow, index, self.rules[ri].sid))

    # CPU path -----------------------------------------------------------------
    def cpu_state(self, flow: int):
        return [[[b"", b""] for _ in self.sides], [{}, {}]]

    def cpu(self, state, ctx, payload: bytes, out: Outputs) -> bool:
        if not self.watched[ctx.flow, ctx.direction]:
            return True
        tails, seen = state
        found = []
        d = ctx.direction
        for s, side in enumerate(self.sides):
            tail = tails[s][d]
            hay = tail + (payload.lower() if side.fold else payload)
            found.extend(side.first_pid + pid for pid in side.ending_after(hay, len(tail)))
            tails[s][d] = hay[-side.max_len:]
        if found:
            self.on_matches(seen, ctx.flow, d, ctx.index, found, out)
        return True

    def cpu_block(self, block, data: bytes, starts: np.ndarray, alive: np.ndarray,
                  states: dict, position: int, out: Outputs) -> np.ndarray:
        """``cpu`` over a whole block: one scan per matcher instead of one per message.

        The block's live, watched messages are grouped into streams (flow,
        direction) in block order; each matcher scans one buffer holding, per
        stream, its tail and then its messages. An occurrence counts when it
        lies inside one stream's part and ends after the tail, and belongs to
        the message holding its last byte: exactly the occurrences ``cpu``
        finds message by message. ``on_matches`` then runs per message with a
        match, in block order (the order decides which direction completes a
        rule first), and each stream keeps its last ``max_len`` bytes as the tail.
        Streams are scanned ``SCAN_BYTES`` of messages at a time (a longer stream
        alone): no occurrence spans two streams' parts, so the buffers stay small
        whatever the block's size.
        """
        rows = np.flatnonzero(alive & self.watched[block.flow, block.direction])
        if len(rows) == 0 or not self.sides:
            return alive
        key = block.flow[rows] * 2 + block.direction[rows]
        order = rows[np.argsort(key, kind="stable")]  # messages by stream, in block order
        key = key[np.argsort(key, kind="stable")]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        length = block.length[order]
        msg_start = np.cumsum(length) - length  # in ``raw``: the messages back to back
        stream_start = msg_start[first]
        stream_end = np.r_[stream_start[1:], msg_start[-1] + length[-1]]
        ranges = _stream_ranges(key, starts[order], length)
        owners = list(zip((key[first] // 2).tolist(), (key[first] % 2).tolist()))
        opens = [i for i, (stream, _, _) in enumerate(ranges) if stream >= 0] + [len(ranges)]
        view = memoryview(data)
        hit_msg, hit_pid = [], []
        bounds = _chunks((stream_end - stream_start).tolist(), SCAN_BYTES)
        for s0, s1 in zip(bounds[:-1], bounds[1:]):
            chunk = _Chunk(ranges[opens[s0]:opens[s1]], owners[s0:s1], s0,
                           stream_start[s0:s1], stream_end[s0:s1])
            for s, side in enumerate(self.sides):
                last, pids = self._scan(side, s, chunk, view, states, position)
                hit_msg.append(np.searchsorted(msg_start, last, side="right") - 1)
                hit_pid.append(pids + side.first_pid)
        msg = order[np.concatenate(hit_msg)] if hit_msg else order[:0]  # block rows
        if len(msg) == 0:
            return alive
        pid = np.concatenate(hit_pid)
        by_row = np.argsort(msg, kind="stable")
        msg, pid = msg[by_row], pid[by_row]
        bounds = np.flatnonzero(np.r_[True, msg[1:] != msg[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            row = int(msg[a])
            flow, d = int(block.flow[row]), int(block.direction[row])
            self.on_matches(states[flow][position][1], flow, d, int(block.index[row]),
                            pid[a:b].tolist(), out)
        return alive

    @staticmethod
    def _scan(side: _Side, s: int, chunk: _Chunk, view: memoryview, states: dict,
              position: int) -> tuple[np.ndarray, np.ndarray]:
        """Matcher ``side`` (the NF's ``s``-th) over the streams of ``chunk``, each its tail
        and then its messages; the streams' tails updated. Per occurrence that counts:
        its last byte's place among the block's messages back to back, and its pattern id
        (the matcher's own)."""
        tails = [states[f][position][0][s][d] for f, d in chunk.owners]
        pieces = []
        for stream, a, b in chunk.ranges:
            if stream >= 0:
                pieces.append(tails[stream - chunk.first])
            pieces.append(view[a:b])
        hay = b"".join(pieces)
        del pieces
        if side.fold:  # the tails are lower-cased already: lowering them again keeps them
            hay = hay.lower()
        tail_len = np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))
        # where each stream's part (tail, then messages) starts in ``hay``
        base = chunk.start[0]
        part = chunk.start - base + np.cumsum(tail_len) - tail_len
        for (f, d), a, b in zip(chunk.owners, part.tolist(),
                                (part + tail_len + chunk.end - chunk.start).tolist()):
            states[f][position][0][s][d] = hay[max(a, b - side.max_len):b]
        pids, ends = side.occurrences(hay)
        j = np.searchsorted(part, ends - 1, side="right") - 1
        inside = (ends - side.lengths[pids] >= part[j]) & (ends > part[j] + tail_len[j])
        pids, ends, j = pids[inside], ends[inside], j[inside]
        return ends - 1 - part[j] - tail_len[j] + chunk.start[j], pids  # last byte, in ``raw``

    def _pair(self, nodes_by_side: list[int]) -> tuple[int, int]:
        pair = [0, 0]
        for side, node in zip(self.sides, nodes_by_side):
            pair[0 if side is self.cs else 1] = node
        return pair[0], pair[1]

    def export_flow(self, state):
        """Portable state: per direction the (case-sensitive, nocase) trie nodes and the
        patterns seen."""
        tails, seen = state
        nodes = [self._pair([side.automaton.step_text(tails[s][d])
                             for s, side in enumerate(self.sides)]) for d in (0, 1)]
        return nodes, [dict(seen[0]), dict(seen[1])]

    def import_flow(self, value):
        nodes, seen = value
        tails = [[side.node_text[nodes[d][0 if side is self.cs else 1]] for d in (0, 1)]
                 for side in self.sides]
        return [tails, [dict(seen[0]), dict(seen[1])]]

    # GPU path -----------------------------------------------------------------
    def dfa(self) -> Dfa:
        if self._dfa is None:
            self._dfa = Dfa.product(self.cs.automaton if self.cs else None,
                                    self.nc.automaton if self.nc else None,
                                    len(self.cs.automaton.patterns) if self.cs else 0,
                                    len(self.pid))
        return self._dfa

    def table(self) -> StrideTable:
        if self._table is None:
            self._table = StrideTable.build(self.dfa())
        return self._table

    def stride(self) -> int:
        """Bytes per kernel step: the largest stride whose table fits."""
        return self.table().stride if self.sides else 1

    def gpu_export(self, flow: int):
        pairs = self.dfa().pairs
        seen = self.seen.get(flow, [{}, {}])
        return ([tuple(int(x) for x in pairs[self.nodes[flow, d]]) for d in (0, 1)],
                [dict(seen[0]), dict(seen[1])])

    def gpu_import(self, flow: int, value) -> None:
        nodes, seen = value
        index = self.dfa().index
        for d in (0, 1):
            state = index.get(tuple(nodes[d]))
            if state is None:  # cannot happen for states reached by a real stream
                raise RuntimeFailure(f"IDS state {nodes[d]} of flow {flow} is not reachable")
            self.nodes[flow, d] = state
        if seen[0] or seen[1]:
            self.seen[flow] = [dict(seen[0]), dict(seen[1])]
        else:
            self.seen.pop(flow, None)

    def warm_up(self, dev: torch.device) -> None:
        """Build the table on ``dev`` and run the step loop once (compiles it), so that
        the first batch's time measures the kernel, not one-time set-up."""
        if not self.sides:
            return
        t = self._tensors(dev)
        state = torch.zeros(2, dtype=torch.int32, device=dev)
        data = torch.zeros(4, dtype=torch.int32, device=dev)
        _kernels().step_packed(state, data, torch.empty(4, dtype=torch.int32, device=dev), t["next"],
                    [2, 2], [0, 2])

    def step_seconds(self, dev: torch.device, steps: int = 400) -> float:
        """Measured time of one kernel step (one row): the floor of the cost model's r_step."""
        if not self.sides:
            return 0.0
        t = self._tensors(dev)
        state = torch.zeros(1, dtype=torch.int32, device=dev)
        data = torch.zeros(steps, dtype=torch.int32, device=dev)
        traj = torch.empty(steps, dtype=torch.int32, device=dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter() if dev.type == "cuda" else time.thread_time()
        _kernels().step_packed(state, data, traj, t["next"], [1] * steps, list(range(steps)))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            return (time.perf_counter() - start) / steps
        return (time.thread_time() - start) / steps

    def _class_bytes(self) -> bytes:
        """``bytes.translate`` table: byte -> its class (classes fit a byte)."""
        if self._classes is None:
            t = self.table()
            if t.nop > 255:  # at most 256 classes: 255 byte classes and the no-op
                raise RuntimeFailure(f"IDS automaton has {t.nop} byte classes; at most 255")
            self._classes = bytes(t.classes.astype(np.uint8).tolist())
        return self._classes

    def _tensors(self, dev: torch.device) -> dict:
        if dev not in self._on:
            t = self.table()
            if t.next_scaled.max(initial=0) + t.symbols >= 2**31:
                raise RuntimeFailure("IDS transition table too large for 32-bit indices")
            self._on[dev] = {"next": torch.from_numpy(t.next_scaled.astype(np.int32)).to(dev),
                             "any": torch.from_numpy(t.any_out.astype(np.uint8)).to(dev)}
        return self._on[dev]

    def gpu(self, batch: GpuBatch, alive: torch.Tensor, out: Outputs) -> torch.Tensor:
        keep = (alive.cpu().numpy() & self.watched[batch.flow, batch.direction]
                & (batch.length > 0))
        idx = np.flatnonzero(keep)
        if len(idx) == 0 or not self.sides:
            return alive
        for flow, index, direction, pids in self._kernel(batch, idx):
            self.on_matches(self.seen.setdefault(flow, [{}, {}]), flow, direction, index, pids,
                            out)
        return alive

    def _kernel(self, batch: GpuBatch, idx: np.ndarray) -> list[tuple[int, int, int, list[int]]]:
        """Step the product DFA over the packed streams of messages ``idx``.

        Rows are (flow, direction) streams, ``k`` bytes per step; the loop runs
        ``longest stream / k`` steps. O(bytes) work besides the steps.
        """
        dev = batch.device
        table = self.table()
        k = table.stride
        flow = batch.flow[idx]
        direction = batch.direction[idx]
        row_key = flow * 2 + direction
        order = np.argsort(row_key, kind="stable")  # messages grouped by stream, in order
        idx, flow, direction, row_key = idx[order], flow[order], direction[order], row_key[order]
        length = batch.length[idx]
        nsym = -(-length // k)
        msg_sym_start = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(nsym[:-1], out=msg_sym_start[1:])
        total = int(msg_sym_start[-1] + nsym[-1])
        row_first = np.flatnonzero(np.r_[True, row_key[1:] != row_key[:-1]])
        row_start = msg_sym_start[row_first]
        row_len = np.diff(np.r_[row_start, total])
        rows = len(row_len)
        # symbols: byte classes (bytes.translate), each message padded to a multiple of k
        # with the no-op class, then k classes combined into one symbol
        classes = join_bytes(batch.blob, batch.offset[idx], length).translate(self._class_bytes())
        pad = (-length) % k
        if pad.any():
            view, at, pieces = memoryview(classes), 0, []
            nop = bytes([table.nop]) * k
            for n, p in zip(length.tolist(), pad.tolist()):
                pieces.append(view[at:at + n])
                pieces.append(nop[:p])
                at += n
            classes = b"".join(pieces)
        cls = np.frombuffer(classes, np.uint8)
        sym = cls[0::k].astype(np.int32)
        for j in range(1, k):
            sym *= table.nop + 1
            sym += cls[j::k]
        # packed, length-sorted, time-major layout
        rank_order = np.argsort(-row_len, kind="stable")
        rank = np.empty(rows, dtype=np.int64)
        rank[rank_order] = np.arange(rows)
        lmax = int(row_len[rank_order[0]])
        counts = np.bincount(row_len, minlength=lmax + 1)
        active = rows - np.cumsum(counts)[:lmax]  # rows with length > t
        offs = np.zeros(lmax, dtype=np.int64)
        np.cumsum(active[:-1], out=offs[1:])
        t_of = np.arange(total, dtype=np.int64)
        t_of -= np.repeat(row_start, row_len)
        where_to = offs[t_of]
        where_to += np.repeat(rank, row_len)
        packed = np.empty(total, dtype=np.int32)
        packed[where_to] = sym
        start = self.nodes[flow[row_first], direction[row_first]] * table.symbols
        tensors = self._tensors(dev)
        traj = torch.empty(total, dtype=torch.int32, device=dev)
        state = _kernels().step_packed(torch.from_numpy(start[rank_order].astype(np.int32)).to(dev),
                            torch.from_numpy(packed).to(dev), traj, tensors["next"],
                            active.tolist(), offs.tolist())
        final = np.empty(rows, dtype=np.int64)
        final[rank_order] = state.cpu().numpy()
        self.nodes[flow[row_first], direction[row_first]] = final // table.symbols
        where = torch.index_select(tensors["any"], 0, traj).nonzero().squeeze(1)
        if where.numel() == 0:
            return []
        pos = where.cpu().numpy()
        masks = table.outputs(traj[where].cpu().numpy().astype(np.int64))  # [words, hits]
        step = np.searchsorted(offs, pos, side="right") - 1
        r = rank_order[pos - offs[step]]
        msg = np.searchsorted(msg_sym_start, row_start[r] + step, side="right") - 1
        hits: dict[tuple[int, int, int], list[int]] = {}  # (flow, index, direction) -> pids
        for h in range(len(pos)):
            m = int(msg[h])
            pids = hits.setdefault((int(flow[m]), int(batch.index[idx[m]]), int(direction[m])), [])
            for w in range(masks.shape[0]):
                bits = int(masks[w, h])
                while bits:
                    low = bits & -bits
                    pids.append(w * WORD_BITS + low.bit_length() - 1)
                    bits ^= low
        return [(f, i, d, p) for (f, i, d), p in sorted(hits.items())]
