"""IDS: multi-pattern matching of Snort-style rules over each flow's reassembled payload.

Patterns (``content``) are matched per direction as a continuous stream, so a
pattern split across two messages (or two batches) is found: the automaton
state of each direction is carried from message to message. A rule alerts
once per flow, at the message where the last of its contents is first seen
(contents may come from either direction, in any order).

CPU path: ``pyahocorasick`` automata (one case-sensitive, one for ``nocase``
contents over lower-cased bytes) run over ``tail + message`` where ``tail`` is
the last ``max_len`` bytes of the direction's stream; a match counts when it
ends inside the message. GPU path: the same Aho-Corasick automaton, built by
``automaton.py`` as a transition table with ``k`` bytes per step, stepped over
the share's byte streams laid out as a ``[flows x bytes]`` matrix padded to the
longest flow with a no-op symbol. The matrix is kept length-sorted and packed
time-major (like ``torch.nn.utils.rnn.PackedSequence``), so step ``t`` touches
only the rows still running: work is proportional to the bytes, steps to the
longest flow. Hand-over between the two is exact: the trie node of a state is
a valid tail, and stepping a tail gives the node back.
"""

from __future__ import annotations

import ahocorasick
import numpy as np
import torch

from .automaton import WORD_BITS, Automaton, StrideTable
from .base import GpuBatch, Outputs
from .kernels import step_packed
from .snort import Rule, load_rules

NAME = "ids"


class _Side:
    """One automaton (case-sensitive or nocase) in all three forms."""

    def __init__(self, patterns: list[bytes], first_pid: int, fold: bool):
        self.fold = fold
        self.first_pid = first_pid
        self.automaton = Automaton.build(patterns)
        self.max_len = self.automaton.max_len
        self.aho = ahocorasick.Automaton()
        for i, p in enumerate(patterns):
            self.aho.add_word(p.decode("latin-1"), first_pid + i)
        self.aho.make_automaton()
        self.node_text = [t.decode("latin-1") for t in self.automaton.node_text]
        self.table: StrideTable | None = None

    def stride_table(self) -> StrideTable:
        if self.table is None:
            self.table = StrideTable.build(self.automaton, fold_case=self.fold)
        return self.table


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
        order = cs + nc
        self.pid = {k: i for i, k in enumerate(order)}
        self.sides: list[_Side] = []
        if cs:
            self.sides.append(_Side([k[0] for k in cs], 0, False))
        if nc:
            self.sides.append(_Side([k[0] for k in nc], len(cs), True))
        self.rule_pids = [frozenset(self.pid[(c.pattern.lower() if c.nocase else c.pattern,
                                              c.nocase)] for c in r.contents) for r in self.rules]
        self.rules_of: list[list[int]] = [[] for _ in order]
        for ri, pids in enumerate(self.rule_pids):
            for p in pids:
                self.rules_of[p].append(ri)
        n = len(flows)
        self.applies = np.zeros((n, len(self.rules)), dtype=bool)
        for ri, rule in enumerate(self.rules):
            for f in range(n):
                self.applies[f, ri] = rule.applies(flows.names[f], int(flows.client_port[f]),
                                                   int(flows.server_port[f]))
        self.watched = self.applies.any(axis=1)
        # GPU-side state: automaton node per (flow, direction, side); seen patterns per flow
        self.nodes = np.zeros((n, 2, len(self.sides)), dtype=np.int64)
        self.seen: dict[int, dict[int, int]] = {}
        self._on: dict = {}

    # shared rule logic ---------------------------------------------------------
    def on_matches(self, seen: dict[int, int], flow: int, index: int, pids, out: Outputs) -> None:
        """Record patterns first seen at message ``index``; alert rules completed now."""
        new = [p for p in pids if p not in seen]
        if not new:
            return
        for p in new:
            seen[p] = index
        fired = set()
        for p in new:
            for ri in self.rules_of[p]:
                if ri in fired or not self.applies[flow, ri]:
                    continue
                if all(q in seen for q in self.rule_pids[ri]):
                    fired.add(ri)
        for ri in sorted(fired):
            out.alerts.append((flow, index, self.rules[ri].sid))

    # CPU path -----------------------------------------------------------------
    def cpu_state(self, flow: int):
        return [[["", ""] for _ in self.sides], {}]

    def cpu(self, state, ctx, payload: bytes, out: Outputs) -> bool:
        if not self.watched[ctx.flow]:
            return True
        tails, seen = state
        found = []
        d = ctx.direction
        for s, side in enumerate(self.sides):
            text = (payload.lower() if side.fold else payload).decode("latin-1")
            tail = tails[s][d]
            hay = tail + text
            skip = len(tail)
            for end, pid in side.aho.iter(hay):
                if end >= skip:
                    found.append(pid)
            tails[s][d] = hay[-side.max_len:]
        if found:
            self.on_matches(seen, ctx.flow, ctx.index, found, out)
        return True

    def export_flow(self, state):
        tails, seen = state
        nodes = [[side.automaton.step_text(tails[s][d].encode("latin-1")) for d in (0, 1)]
                 for s, side in enumerate(self.sides)]
        return nodes, dict(seen)

    def import_flow(self, value):
        nodes, seen = value
        tails = [[side.node_text[nodes[s][d]] for d in (0, 1)] for s, side in enumerate(self.sides)]
        return [tails, dict(seen)]

    # GPU path -----------------------------------------------------------------
    def stride(self) -> int:
        """Bytes per kernel step: the largest stride whose tables fit, equal for all sides."""
        tables = [side.stride_table() for side in self.sides]
        k = min(t.stride for t in tables)
        for side, t in zip(self.sides, tables):
            if t.stride != k:
                side.table = StrideTable.build(side.automaton, fold_case=side.fold, max_stride=k)
                self._on.clear()
        return k

    def gpu_export(self, flow: int):
        return ([[int(self.nodes[flow, d, s]) for d in (0, 1)] for s in range(len(self.sides))],
                dict(self.seen.get(flow, {})))

    def gpu_import(self, flow: int, value) -> None:
        nodes, seen = value
        for s in range(len(self.sides)):
            for d in (0, 1):
                self.nodes[flow, d, s] = nodes[s][d]
        if seen:
            self.seen[flow] = dict(seen)
        else:
            self.seen.pop(flow, None)

    def gpu(self, batch: GpuBatch, alive: torch.Tensor, out: Outputs) -> torch.Tensor:
        keep = alive.cpu().numpy() & self.watched[batch.flow] & (batch.length > 0)
        idx = np.flatnonzero(keep)
        if len(idx) == 0 or not self.sides:
            return alive
        hits = self._kernel(batch, idx)
        for flow, index, pids in hits:
            self.on_matches(self.seen.setdefault(flow, {}), flow, index, pids, out)
        return alive

    def _kernel(self, batch: GpuBatch, idx: np.ndarray) -> list[tuple[int, int, list[int]]]:
        """Step the automata over the packed streams of messages ``idx``.

        Rows are (flow, direction, side) streams; both sides (case-sensitive and
        nocase) share one table with per-side state offsets, so one loop of
        ``longest stream / stride`` steps serves them all.
        """
        dev = batch.device
        k = self.stride()
        sides = len(self.sides)
        flow = batch.flow[idx]
        direction = batch.direction[idx].astype(np.int64)
        row_key = flow * 2 + direction
        order = np.argsort(row_key, kind="stable")  # messages grouped by stream, in order
        idx, flow, direction, row_key = idx[order], flow[order], direction[order], row_key[order]
        length = batch.length[idx]
        nsym = -(-length // k)
        msg_sym_start = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(nsym[:-1], out=msg_sym_start[1:])
        total_sym = int(nsym.sum())
        row_first = np.flatnonzero(np.r_[True, row_key[1:] != row_key[:-1]])
        row_start = msg_sym_start[row_first]
        row_len = np.diff(np.r_[row_start, total_sym])
        rows = len(row_len)
        raw = _symbols_bytes(batch, idx, length, nsym, k)
        # packed, length-sorted, time-major layout; side s of stream r is row s*rows + r
        all_len = np.tile(row_len, sides)
        rank_order = np.argsort(-all_len, kind="stable")
        rank = np.empty_like(rank_order)
        rank[rank_order] = np.arange(len(rank_order))
        lmax = int(row_len.max())
        counts = np.bincount(all_len, minlength=lmax + 1)
        active = len(all_len) - np.cumsum(counts)[:lmax]  # rows with length > t
        offs = np.zeros(lmax, dtype=np.int64)
        np.cumsum(active[:-1], out=offs[1:])
        sym_row = np.repeat(np.arange(rows), row_len)
        sym_t = np.arange(total_sym, dtype=np.int64) - np.repeat(row_start, row_len)
        packed = np.empty(total_sym * sides, dtype=np.int64)
        start_state = np.empty(rows * sides, dtype=np.int64)
        bases = self._table_bases()
        for s, side in enumerate(self.sides):
            table = side.table
            classes = np.append(table.classes, table.nop)  # byte 256 is the padding
            weights = (table.nop + 1) ** np.arange(k - 1, -1, -1, dtype=np.int64)
            sym = (classes[raw].reshape(-1, k) * weights).sum(axis=1)
            packed[offs[sym_t] + rank[sym_row + s * rows]] = sym
            nodes = self.nodes[flow[row_first], direction[row_first], s]
            start_state[s * rows:(s + 1) * rows] = bases[s] + nodes * table.symbols
        tensors = self._tensors(dev)
        state = torch.from_numpy(start_state[rank_order]).to(dev)
        traj = torch.empty(total_sym * sides, dtype=torch.int64, device=dev)
        state = step_packed(state, torch.from_numpy(packed).to(dev), traj, tensors["next"],
                            active.tolist(), offs.tolist())
        final = state.cpu().numpy()
        unranked = np.empty_like(final)
        unranked[rank_order] = final
        for s, side in enumerate(self.sides):
            nodes = (unranked[s * rows:(s + 1) * rows] - bases[s]) // side.table.symbols
            self.nodes[flow[row_first], direction[row_first], s] = nodes
        where = tensors["any"][traj].nonzero().squeeze(1)
        if where.numel() == 0:
            return []
        masks = tensors["out"][:, traj[where]].cpu().numpy()  # [words, hits]
        pos = where.cpu().numpy()
        step = np.searchsorted(offs, pos, side="right") - 1
        r = rank_order[pos - offs[step]] % rows
        msg = np.searchsorted(msg_sym_start, row_start[r] + step, side="right") - 1
        hits: dict[tuple[int, int], list[int]] = {}
        for h in range(len(pos)):
            m = int(msg[h])
            pids = hits.setdefault((int(flow[m]), int(batch.index[idx[m]])), [])
            for w in range(masks.shape[0]):
                bits = int(masks[w, h])
                while bits:
                    low = bits & -bits
                    pids.append(w * WORD_BITS + low.bit_length() - 1)
                    bits ^= low
        return [(f, i, p) for (f, i), p in sorted(hits.items())]

    def _table_bases(self) -> list[int]:
        bases, base = [], 0
        for side in self.sides:
            bases.append(base)
            base += side.automaton.states * side.table.symbols
        return bases

    def _tensors(self, dev: torch.device) -> dict:
        """One table for all sides: next (offset per side), any-output flag, output words
        over global pattern ids."""
        if dev not in self._on:
            bases = self._table_bases()
            words = -(-len(self.pid) // WORD_BITS) or 1
            nxt, anys, outs = [], [], []
            for side, base in zip(self.sides, bases):
                t = side.table
                nxt.append(t.next_scaled + base)
                anys.append(t.any_out)
                out = np.zeros((words, t.out.shape[1]), dtype=np.int64)
                # shift the side's local pattern bits to global ids
                for w in range(t.out.shape[0]):
                    for j in range(WORD_BITS):
                        local = w * WORD_BITS + j
                        if local >= len(side.automaton.patterns):
                            break
                        g = side.first_pid + local
                        bit = (t.out[w] >> j) & 1
                        out[g // WORD_BITS] |= bit << (g % WORD_BITS)
                outs.append(out)
            self._on[dev] = {"next": torch.from_numpy(np.concatenate(nxt)).to(dev),
                             "any": torch.from_numpy(np.concatenate(anys)).to(dev),
                             "out": torch.from_numpy(np.concatenate(outs, axis=1)).to(dev)}
        return self._on[dev]


def _symbols_bytes(batch: GpuBatch, idx: np.ndarray, length: np.ndarray, nsym: np.ndarray,
                   k: int) -> np.ndarray:
    """Message bytes back to back, each message padded to a multiple of ``k`` with 256."""
    starts = np.zeros(len(idx), dtype=np.int64)
    np.cumsum(nsym[:-1] * k, out=starts[1:])
    total = int(nsym.sum()) * k
    n = int(length.sum())
    within = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
    out = np.full(total, 256, dtype=np.int64)
    out[np.repeat(starts, length) + within] = batch.payload[np.repeat(batch.offset[idx], length)
                                                          + within]
    return out
