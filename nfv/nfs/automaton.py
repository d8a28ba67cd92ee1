"""Aho-Corasick automata as dense transition tables, for the batched IDS kernel.

``Automaton.build(patterns)`` makes the Aho-Corasick trie (goto + failure
links) and turns it into a DFA: ``delta[state, byte]`` and, per state, the set
of patterns that end there (as 63-bit words). The same automaton serves three
uses:

* ``node_text`` gives the string of each trie node, so a CPU matcher that
  keeps the last ``max_len`` bytes of a stream can hand its state over, and
  ``step_text`` gives the node a stream ends in (state migration);
* ``Dfa.product`` joins a case-sensitive and a nocase automaton into one DFA;
* ``StrideTable`` compresses bytes into equivalence classes (bytes whose
  columns of ``delta`` are equal), adds a no-op class used for padding, and
  composes ``k`` steps into one table of ``classes**k`` symbols, so the tensor
  kernel makes one lookup per ``k`` bytes;
* the tensor kernel (``ids.py``) steps that table over packed flows.

Construction is O(total pattern length x 256); a stride table is
O(states x symbols).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

WORD_BITS = 63
TABLE_LIMIT = 1 << 23  # entries of a stride table: at most 8M (32 MB as int32, 8 MB flags)


@dataclass(frozen=True, slots=True)
class Automaton:
    """A DFA over bytes; state 0 is the root. ``out[w, s]`` bit j: pattern 63*w+j ends at s."""

    delta: np.ndarray  # [states, 256] int64
    out: np.ndarray  # [words, states] int64
    depth: np.ndarray  # [states] int64
    node_text: tuple[bytes, ...]
    patterns: tuple[bytes, ...]

    @property
    def states(self) -> int:
        return int(self.delta.shape[0])

    @property
    def max_len(self) -> int:
        return max((len(p) for p in self.patterns), default=0)

    @classmethod
    def build(cls, patterns: list[bytes]) -> Automaton:
        """Aho-Corasick over ``patterns`` (distinct, non-empty), as a full DFA."""
        goto: list[dict[int, int]] = [{}]
        text = [b""]
        ends: list[list[int]] = [[]]
        for pid, pattern in enumerate(patterns):
            node = 0
            for byte in pattern:
                nxt = goto[node].get(byte)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][byte] = nxt
                    goto.append({})
                    text.append(text[node] + bytes([byte]))
                    ends.append([])
                node = nxt
            ends[node].append(pid)
        n = len(goto)
        delta = np.zeros((n, 256), dtype=np.int64)
        fail = [0] * n
        outputs = [set(e) for e in ends]
        queue: deque[int] = deque()
        for byte, child in goto[0].items():
            delta[0, byte] = child
            queue.append(child)
        while queue:
            node = queue.popleft()
            f = fail[node]
            outputs[node] |= outputs[f]
            delta[node] = delta[f]
            for byte, child in goto[node].items():
                delta[node, byte] = child
                fail[child] = int(delta[f, byte]) if node else 0
                queue.append(child)
        words = max(1, -(-len(patterns) // WORD_BITS))
        out = np.zeros((words, n), dtype=np.int64)
        for state, pids in enumerate(outputs):
            for pid in pids:
                out[pid // WORD_BITS, state] |= 1 << (pid % WORD_BITS)
        depth = np.array([len(t) for t in text], dtype=np.int64)
        return cls(delta=delta, out=out, depth=depth, node_text=tuple(text),
                   patterns=tuple(patterns))

    def step_text(self, data: bytes, state: int = 0) -> int:
        """The state after feeding ``data`` from ``state`` (used for short tails)."""
        delta = self.delta
        for byte in data:
            state = int(delta[state, byte])
        return state

    def matches(self, data: bytes, state: int = 0) -> tuple[int, list[tuple[int, int]]]:
        """Reference stepping: final state and (end position, pattern id) of every match."""
        found = []
        for pos, byte in enumerate(data):
            state = int(self.delta[state, byte])
            for w in range(self.out.shape[0]):
                bits = int(self.out[w, state])
                while bits:
                    low = bits & -bits
                    found.append((pos, w * WORD_BITS + low.bit_length() - 1))
                    bits ^= low
        return state, found


@dataclass(frozen=True, slots=True)
class Dfa:
    """The product of a case-sensitive automaton (raw bytes) and a nocase one (folded bytes).

    One DFA so that the tensor kernel makes one lookup per step for both kinds
    of content. ``pairs[s]`` are the component states of product state ``s``;
    ``out[w, s]`` has bit j set when global pattern 63*w+j ends at ``s``. Only
    reachable pairs are built (for Aho-Corasick automata about the sum of the
    two sizes).
    """

    delta: np.ndarray  # [states, 256] int64
    out: np.ndarray  # [words, states] int64
    pairs: np.ndarray  # [states, 2] int64
    index: dict

    @property
    def states(self) -> int:
        return int(self.delta.shape[0])

    @classmethod
    def product(cls, cs: Automaton | None, nc: Automaton | None, nc_first: int,
                patterns: int) -> Dfa:
        lower = np.arange(256)
        lower[65:91] += 32
        d1 = cs.delta if cs is not None else np.zeros((1, 256), dtype=np.int64)
        d2 = nc.delta[:, lower] if nc is not None else np.zeros((1, 256), dtype=np.int64)
        index = {(0, 0): 0}
        order = [(0, 0)]
        rows = []
        i = 0
        while i < len(order):
            s1, s2 = order[i]
            i += 1
            row = []
            for pair in zip(d1[s1].tolist(), d2[s2].tolist()):
                j = index.get(pair)
                if j is None:
                    j = index[pair] = len(order)
                    order.append(pair)
                row.append(j)
            rows.append(row)
        pairs = np.array(order, dtype=np.int64)
        words = max(1, -(-patterns // WORD_BITS))
        out = np.zeros((words, len(order)), dtype=np.int64)
        for auto, comp, first in ((cs, 0, 0), (nc, 1, nc_first)):
            if auto is None:
                continue
            for local in range(len(auto.patterns)):
                bit = (auto.out[local // WORD_BITS, pairs[:, comp]] >> (local % WORD_BITS)) & 1
                g = first + local
                out[g // WORD_BITS] |= bit << (g % WORD_BITS)
        return cls(delta=np.array(rows, dtype=np.int64), out=out, pairs=pairs, index=index)

    def step_text(self, data: bytes, state: int = 0) -> int:
        delta = self.delta
        for byte in data:
            state = int(delta[state, byte])
        return state


@dataclass(frozen=True, slots=True)
class StrideTable:
    """``k`` DFA steps per lookup over byte classes; class ``nop`` leaves the state alone.

    ``next_scaled[s * symbols + sym] = next_state * symbols`` so that a state
    can be kept pre-multiplied; ``any_out[s * symbols + sym]`` is True when a
    pattern ends within the ``k`` bytes; ``outputs`` recovers which ones.
    """

    classes: np.ndarray  # [256] int64, class of each byte
    nop: int
    stride: int
    symbols: int
    next_scaled: np.ndarray  # [states * symbols] int64
    any_out: np.ndarray  # [states * symbols] bool
    class_delta: np.ndarray  # [states, classes + 1] int64 (last column: no-op)
    state_out: np.ndarray  # [words, states] int64

    @classmethod
    def build(cls, dfa, *, max_stride: int = 4, limit: int = TABLE_LIMIT) -> StrideTable:
        """``dfa`` has ``delta`` [S, 256] and ``out`` [W, S] (an ``Automaton`` or ``Dfa``)."""
        delta = dfa.delta
        _, first, inverse = np.unique(delta.T, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        n_classes = len(first)
        order = np.argsort(first)
        remap = np.empty(n_classes, dtype=np.int64)
        remap[order] = np.arange(n_classes)
        classes = remap[inverse].astype(np.int64)
        cls_delta = delta[:, np.sort(first)]
        n_sym = n_classes + 1
        nop = n_classes
        states = delta.shape[0]
        one = np.concatenate([cls_delta, np.arange(states)[:, None]], axis=1)  # [S, n_sym]
        has_out = (dfa.out != 0).any(axis=0)  # [S]
        stride = 1
        while stride < max_stride and states * n_sym ** (stride + 1) <= limit:
            stride += 1
        real = np.arange(n_sym) != nop
        nxt = one.copy()
        hit = has_out[one] & real[None, :]
        for _ in range(stride - 1):
            width = nxt.shape[1]
            nxt2 = one[nxt]  # [S, width, n_sym]
            hit = (hit[:, :, None] | (has_out[nxt2] & real[None, None, :])).reshape(
                states, width * n_sym)
            nxt = nxt2.reshape(states, width * n_sym)
        symbols = nxt.shape[1]
        return cls(classes=classes, nop=nop, stride=stride, symbols=symbols,
                   next_scaled=(nxt * symbols).reshape(-1), any_out=hit.reshape(-1),
                   class_delta=one, state_out=dfa.out)

    def outputs(self, index: np.ndarray) -> np.ndarray:
        """[words, n] pattern bits of the steps ``index`` (= state * symbols + symbol)."""
        state = index // self.symbols
        sym = index % self.symbols
        n_sym = self.nop + 1
        out = np.zeros((self.state_out.shape[0], len(index)), dtype=np.int64)
        for j in range(self.stride - 1, -1, -1):
            c = (sym // n_sym ** j) % n_sym
            state = self.class_delta[state, c]
            out |= np.where(c != self.nop, self.state_out[:, state], 0)
        return out
