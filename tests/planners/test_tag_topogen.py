"""`random:N` topologies: every seed gives a topology the artifact accepts (it round-trips
through a file), of 2 to 16 GPUs from the catalog, the same for the same seed; specs parse
or are refused naming themselves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import BadInput, DeviceKind, load, save
from dl_nfv.artifacts.topology import cluster_of
from dl_nfv.planners.tag.topogen import MAX_DEVICES, generate, seeds_of, topologies_of


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_generated_topology_validates_and_round_trips(tmp_path_factory, seed):
    topology = generate(seed)
    path = save(topology, tmp_path_factory.mktemp("topo") / "t.yaml")
    again = load(path, expect="topology")  # the artifact's validation, from the file
    assert again == topology and again.name == f"random-{seed}"
    cluster = cluster_of(again)
    names = cluster.device_names
    assert 2 <= len(names) <= MAX_DEVICES
    assert all(cluster.device(d).type.kind is DeviceKind.GPU for d in names)
    for a in names:  # every pair has a route
        for b in names:
            if a != b:
                assert cluster.route(a, b).bandwidth_gbps > 0
    assert generate(seed) == topology


def test_the_generator_makes_rings_and_oversubscribed_racks():
    shapes = [generate(s) for s in range(40)]
    rings = [t for t in shapes if not t.switches]
    racks = [t for t in shapes if any(s.name == "spine" for s in t.switches)]
    assert rings and racks
    for t in racks:  # each uplink carries at most its rack's NICs
        for link in t.links:
            tor = link.endpoints[0]
            nics = sum(n.bandwidth_gbps for h in t.hosts for n in h.nics if n.switch == tor)
            assert link.bandwidth_gbps <= nics + 1e-9
    assert any(link.bandwidth_gbps < sum(n.bandwidth_gbps for h in t.hosts for n in h.nics
                                         if n.switch == link.endpoints[0])
               for t in racks for link in t.links)


@pytest.mark.parametrize(("spec", "seeds"), [("random:3", range(0, 3)), ("random:2:10", range(10, 12)),
                                             ("heterog.yaml", None)])
def test_specs_name_their_seeds(spec, seeds):
    assert seeds_of(spec) == seeds


@pytest.mark.parametrize("spec", ["random", "random:", "random:0", "random:-1", "random:2:", "random:a:1"])
def test_a_bad_random_spec_is_refused_naming_it(spec):
    with pytest.raises(BadInput, match=repr(spec).replace("-", r"\-")):
        topologies_of([spec])
