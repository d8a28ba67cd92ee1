"""The Aho-Corasick automaton and its stride tables against naive search."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.nfs.automaton import Automaton, Dfa, StrideTable

ALPHA = st.binary(min_size=1, max_size=6).map(lambda b: bytes(c % 4 + 97 for c in b))


def naive(patterns, text):
    return sorted((i + len(p) - 1, pid) for pid, p in enumerate(patterns)
                  for i in range(len(text) - len(p) + 1) if text[i:i + len(p)] == p)


@settings(max_examples=100, deadline=None)
@given(patterns=st.lists(ALPHA, min_size=1, max_size=8, unique=True),
       text=st.binary(max_size=200).map(lambda b: bytes(c % 5 + 97 for c in b)))
def test_matches_equal_naive_search(patterns, text):
    a = Automaton.build(patterns)
    _, found = a.matches(text)
    assert sorted(found) == naive(patterns, text)
    # state hand-over: the node's text, stepped from the root, gives the node back
    state = a.step_text(text)
    assert a.step_text(a.node_text[state]) == state
    assert text.endswith(a.node_text[state])


@settings(max_examples=60, deadline=None)
@given(cs=st.lists(ALPHA, max_size=4, unique=True), nc=st.lists(ALPHA, max_size=4, unique=True),
       text=st.binary(min_size=1, max_size=120).map(lambda b: bytes(c % 10 + 65 + 32 * (c % 2)
                                                                     for c in b)),
       stride=st.integers(1, 4))
def test_product_stride_table_equals_naive_search(cs, nc, text, stride):
    """Case-sensitive and nocase patterns in one product DFA, k bytes per step."""
    if not cs and not nc:
        return
    a = Automaton.build(cs) if cs else None
    b = Automaton.build(nc) if nc else None
    dfa = Dfa.product(a, b, len(cs), len(cs) + len(nc))
    t = StrideTable.build(dfa, max_stride=stride)
    k = t.stride
    cls = [int(t.classes[x]) for x in text] + [t.nop] * (-len(text) % k)
    state, steps = 0, []
    for i in range(0, len(cls), k):
        sym = 0
        for c in cls[i:i + k]:
            sym = sym * (t.nop + 1) + c
        idx = state * t.symbols + sym
        steps.append((idx, bool(t.any_out[idx])))
        state = int(t.next_scaled[idx]) // t.symbols
    want = naive(cs, text) + [(e, len(cs) + p) for e, p in naive(nc, text.lower())]
    ends = sorted({e // k for e, _ in want})
    assert [i for i, (_, hit) in enumerate(steps) if hit] == ends
    masks = t.outputs(np.array([idx for idx, _ in steps], dtype=np.int64))
    got = sorted((i, p) for i in range(len(steps)) for p in range(len(cs) + len(nc))
                 if (masks[0, i] >> p) & 1)
    assert got == sorted({(e // k, p) for e, p in want})
    # the product state's components are the two automata's states
    s1, s2 = dfa.pairs[state]
    assert (a is None or s1 == a.step_text(text)) and (b is None or s2 == b.step_text(text.lower()))
