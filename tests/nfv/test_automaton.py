"""The Aho-Corasick automaton and its stride tables against naive search."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.nfs.automaton import Automaton, StrideTable

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
@given(patterns=st.lists(ALPHA, min_size=1, max_size=6, unique=True),
       text=st.binary(min_size=1, max_size=120).map(lambda b: bytes(c % 5 + 97 for c in b)),
       stride=st.integers(1, 4), fold=st.booleans())
def test_stride_table_equals_byte_steps(patterns, text, stride, fold):
    a = Automaton.build(patterns)
    t = StrideTable.build(a, fold_case=fold, max_stride=stride)
    k = t.stride
    if fold:
        text = text.upper()
    cls = [int(t.classes[b]) for b in text]
    cls += [t.nop] * (-len(cls) % k)
    state, any_hits = 0, []
    for i in range(0, len(cls), k):
        sym = 0
        for c in cls[i:i + k]:
            sym = sym * (t.nop + 1) + c
        idx = state * t.symbols + sym
        any_hits.append(bool(t.any_out[idx]))
        state = int(t.next_scaled[idx]) // t.symbols
    ref_text = text.lower() if fold else text
    assert state == a.step_text(ref_text)
    ends = {e // k for e, _ in naive(patterns, ref_text)}
    assert [i for i, h in enumerate(any_hits) if h] == sorted(ends)
    assert np.all(t.next_scaled % t.symbols == 0)
