"""An actor-mode migration's batch (``batch.py``): what the destination unpacks equals
what the source packed, flow by flow, through the messaging layer's pickling."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.actors.batch import pack, unpack
from dl_nfv.nfv.actors.chain import Output
from dl_nfv.nfv.actors.wire import Endpoint

entry = st.one_of(st.none(), st.tuples(st.integers(), st.integers()),
                  st.tuples(st.floats(allow_nan=False), st.integers(0, 2 ** 70)))
output = st.builds(Output, st.integers(0, 99), st.integers(0, 99), st.sampled_from(["", "fw"]),
                   st.just((b"\n\x00\x00\x01", 80, b"\n\x00\x00\x02", 1234)))
flow = st.tuples(st.tuples(entry, entry), st.integers(0, 50),
                 st.dictionaries(st.integers(1, 50), output, max_size=3),
                 st.sampled_from(["rt1", "rt2", None]))


@settings(max_examples=60, deadline=None)
@given(st.lists(flow, max_size=30))
def test_a_batch_round_trips_flow_by_flow(rows):
    flows = list(range(100, 100 + len(rows)))
    states, seqs = [r[0] for r in rows], [r[1] for r in rows]
    logs = {i: r[2] for i, r in enumerate(rows) if r[2]}
    replicas = [r[3] for r in rows]
    endpoint = Endpoint("probe")
    try:
        packed = pickle.loads(endpoint.encode(pack(flows, seqs, states, logs, replicas)))
    finally:
        endpoint.close()
    assert unpack(packed) == (flows, seqs, states, logs, replicas)
    if len(set(replicas)) <= 1:
        assert packed[5] == {}  # one replica for all: named once


def test_the_replica_of_most_flows_is_named_once():
    replicas = ["rt3"] * 7 + ["rt1", "rt3", "rt1"]
    packed = pack(list(range(10)), [1] * 10, [()] * 10, {}, replicas)
    assert packed[4] == "rt3" and packed[5] == {7: "rt1", 9: "rt1"}
    assert unpack(packed)[4] == replicas
