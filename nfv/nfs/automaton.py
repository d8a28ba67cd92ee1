"""Aho-Corasick automata as dense transition tables, for the batched IDS kernel.

``Automaton.build(patterns)`` makes the Aho-Corasick trie (goto + failure
links) and turns it into a DFA: ``delta[state, byte]`` and, per state, the set
of patterns that end there (as 63-bit words). The same automaton serves three
uses:

* ``node_text`` gives the string of each trie node, so a CPU matcher that
  keeps the last ``max_len`` bytes of a stream can hand its state over, and
  ``step_text`` gives the node a stream ends in (state migration);
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
TABLE_LIMIT = 1 << 21  # entries of a stride table: at most 2M (16 MB for masks + 8 MB next)


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
class StrideTable:
    """``k`` DFA steps per lookup over byte classes; class ``nop`` leaves the state alone.

    ``next_scaled[s * symbols + sym] = next_state * symbols`` so that a state
    can be kept pre-multiplied; ``any_out[s * symbols + sym]`` is 1 when a
    pattern ends within the ``k`` bytes; ``out[w, s * symbols + sym]`` says which.
    """

    classes: np.ndarray  # [256] int64, class of each byte (after case folding for nocase)
    nop: int
    stride: int
    symbols: int
    next_scaled: np.ndarray  # [states * symbols] int64
    any_out: np.ndarray  # [states * symbols] bool
    out: np.ndarray  # [words, states * symbols] int64

    @classmethod
    def build(cls, automaton: Automaton, *, fold_case: bool = False,
              max_stride: int = 4, limit: int = TABLE_LIMIT) -> StrideTable:
        delta = automaton.delta
        if fold_case:
            lower = np.arange(256)
            lower[65:91] += 32
            delta = delta[:, lower]
        _, first, inverse = np.unique(delta.T, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        n_classes = len(first)
        cls_delta = delta[:, np.sort(first)]
        order = np.argsort(first)
        remap = np.empty(n_classes, dtype=np.int64)
        remap[order] = np.arange(n_classes)
        classes = remap[inverse].astype(np.int64)
        n_sym = n_classes + 1
        nop = n_classes
        states = delta.shape[0]
        one = np.concatenate([cls_delta, np.arange(states)[:, None]], axis=1)  # [S, n_sym]
        words = automaton.out.shape[0]
        state_out = automaton.out  # [W, S]
        stride = 1
        while stride < max_stride and states * n_sym ** (stride + 1) <= limit:
            stride += 1
        nxt = one.copy()
        out = np.where(np.arange(n_sym)[None, None, :] == nop, 0,
                       state_out[:, one])  # [W, S, n_sym]
        for _ in range(stride - 1):
            width = nxt.shape[1]
            nxt2 = one[nxt]  # [S, width, n_sym]
            step_out = np.where(np.arange(n_sym)[None, None, None, :] == nop, 0,
                                state_out[:, nxt2])  # [W, S, width, n_sym]
            out = (out[:, :, :, None] | step_out).reshape(words, states, width * n_sym)
            nxt = nxt2.reshape(states, width * n_sym)
        symbols = nxt.shape[1]
        flat_out = out.reshape(words, states * symbols)
        return cls(classes=classes, nop=nop, stride=stride, symbols=symbols,
                   next_scaled=(nxt * symbols).reshape(-1).astype(np.int64),
                   any_out=(flat_out != 0).any(axis=0), out=flat_out)
