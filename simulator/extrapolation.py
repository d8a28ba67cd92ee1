"""Where a prediction extrapolates: devices whose cores differ from the profile's threads.

A CPU profile times every op with the intra-op threads it ran with (``ProfileInfo.threads``);
a CPU device of the topology computes with its own cores (``DeviceType.cpu_cores``), which
are its worker's threads in ``dl-nfv train``. Where the two differ for a device whose type
the profile measured, the op times the simulator gives that device are not measurements of
it, and ``plan`` and ``simulate`` say so in their notes, with the scaling the cost model
applies (``SCALING``). GPU devices and types the profile did not measure (roofline
estimates) are not concerned.
"""

from __future__ import annotations

from collections.abc import Iterable

from dl_nfv.artifacts import OpGraph, Topology, cluster_of

# How the cost model carries a CPU profile's op times to another thread count.
SCALING = "none: the op times are used as measured"


def extrapolation_notes(devices: Iterable[str], graph: OpGraph,
                        topology: Topology) -> tuple[str, ...]:
    """One note per core count of ``devices`` that differs from the profile's threads.

    Example: ``local/cpu0 has 1 core, but the graph was profiled with 2 threads: its op
    times are extrapolated (scaling: none: the op times are used as measured)``. Empty
    when the graph records no profile. O(devices).
    """
    profile = graph.profile
    if profile is None:
        return ()
    cluster = cluster_of(topology)
    by_cores: dict[int, list[str]] = {}
    for name in dict.fromkeys(devices):
        device_type = cluster.device(name).type
        cores = device_type.cpu_cores
        if cores is not None and device_type.name == profile.device_type and cores != profile.threads:
            by_cores.setdefault(cores, []).append(name)
    notes = []
    for cores, names in sorted(by_cores.items()):
        have = "has" if len(names) == 1 else "have"
        notes.append(f"{', '.join(names)} {have} {cores} core{'s' * (cores != 1)}, but the graph "
                     f"was profiled with {profile.threads} thread{'s' * (profile.threads != 1)}: "
                     f"{'its' if len(names) == 1 else 'their'} op times are extrapolated "
                     f"(scaling: {SCALING})")
    return tuple(notes)
