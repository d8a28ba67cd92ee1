"""How a CPU profile's op times carry to a device's cores, and where a prediction extrapolates.

A CPU profile times every op with the intra-op threads it ran with (``ProfileInfo.threads``)
and, by default, again at 1 thread and at the profiling machine's CPU count, in the same
run (``ProfileInfo.thread_counts``, ``Op.fwd_ms_by_threads``). A CPU device of the
topology computes with its own cores (``DeviceType.cpu_cores``), which are its worker's
threads in ``dl-nfv train``. The cost model gives each device of the profile's type its
ops at its cores (``at_threads``):

* at a measured thread count, the measurement;
* between two measured counts ``n1 < n < n2``, linear in ``1 / n`` between them (Amdahl:
  ``t(n) = a + b / n``, a serial part and a part split over the threads; through the two
  points it also follows ops that a thread pool makes slower, ``b < 0``);
* beyond the largest, the same line through the two largest, held between perfect
  scaling from the largest (``t_max x n_max / n``) and the slowest measurement;
* with one measurement only (a profile made with ``thread_scaling`` off, or an older
  one), the measurement: ``SCALING_NONE``.

``plan`` and ``simulate`` say in their notes which devices got times at a thread count
the profile did not measure, and how (``extrapolation_notes``). GPU devices and types
the profile did not measure (roofline estimates) are not concerned. Limits: a per-op
straight line in ``1 / n`` through two or three points; memory bandwidth shared between
processes of one host is not modelled by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dl_nfv.artifacts import OpGraph, ProfileInfo, Topology, cluster_of

# How the cost model carries a CPU profile's op times to another thread count.
SCALING = "per op, linear in 1/threads between the thread counts the profile timed"
SCALING_BEYOND = ("per op, the line in 1/threads through the two largest thread counts the "
                  "profile timed, held between perfect scaling and the slowest measurement")
SCALING_NONE = "none: the op times are used as measured"


def thread_points(profile: ProfileInfo | None, device_type: str, measured: Mapping[str, float],
                  by_threads: Mapping[str, float]) -> dict[int, float]:
    """Thread count -> an op's time on ``device_type`` (its ``fwd_ms``/``bwd_ms`` and
    ``*_by_threads``), where the profile measured that type; empty elsewhere."""
    if profile is None or device_type != profile.device_type or device_type not in measured:
        return {}
    return {**{int(n): float(ms) for n, ms in by_threads.items()},
            profile.threads: float(measured[device_type])}


def at_threads(points: Mapping[int, float], threads: int) -> float:
    """An op's time at ``threads`` from its times at measured thread counts (module doc).

    >>> at_threads({1: 4.0, 2: 3.0}, 4)  # a = 2, b = 2 beyond the largest
    2.5
    """
    if threads in points:
        return float(points[threads])
    counts = sorted(points)
    if len(counts) == 1:
        return float(points[counts[0]])
    below = [n for n in counts if n < threads]
    above = [n for n in counts if n > threads]
    if below and above:
        n1, n2 = below[-1], above[0]
    elif below:
        n1, n2 = counts[-2], counts[-1]
    else:
        n1, n2 = counts[0], counts[1]
    t1, t2 = points[n1], points[n2]
    value = t1 + (t2 - t1) * (1 / threads - 1 / n1) / (1 / n2 - 1 / n1)
    if below and above:
        return float(value)
    n_edge = counts[-1] if below else counts[0]
    perfect = points[n_edge] * n_edge / threads
    # beyond the largest: no faster than perfect scaling, no slower than the slowest
    # measurement; below the smallest: no slower than perfect scaling, no faster than it
    low = min(perfect, points[n_edge])
    high = max(perfect, points[n_edge]) if threads < n_edge else max(points.values())
    return float(min(max(value, low), high))


def measured_counts(profile: ProfileInfo) -> tuple[int, ...]:
    """The thread counts the profile timed (its ``threads`` alone for older profiles)."""
    return tuple(sorted(set(profile.thread_counts) | {profile.threads}))


def scaling_of(profile: ProfileInfo, cores: int) -> str:
    """How ``cores`` get their op times from ``profile``: "" (measured), or the scaling."""
    counts = measured_counts(profile)
    if cores in counts:
        return ""
    if len(counts) == 1:
        return SCALING_NONE
    return SCALING if counts[0] < cores < counts[-1] else SCALING_BEYOND


def extrapolation_notes(devices: Iterable[str], graph: OpGraph,
                        topology: Topology) -> tuple[str, ...]:
    """One note per core count of ``devices`` at which the profile did not time the ops.

    Example: ``local/cpu0 has 1 core, but the graph was profiled with 2 threads: its op
    times are extrapolated (scaling: none: the op times are used as measured)``, or, for a
    profile that timed 1 and 2 threads, ``h/cpu0 has 4 cores, but the graph was timed at 1,
    2 threads: its op times are extrapolated (scaling: ...)``. Empty when the graph records
    no profile. O(devices).
    """
    profile = graph.profile
    if profile is None:
        return ()
    cluster = cluster_of(topology)
    by_cores: dict[int, list[str]] = {}
    for name in dict.fromkeys(devices):
        device_type = cluster.device(name).type
        cores = device_type.cpu_cores
        if (cores is not None and device_type.name == profile.device_type
                and scaling_of(profile, cores)):
            by_cores.setdefault(cores, []).append(name)
    counts = measured_counts(profile)
    notes = []
    for cores, names in sorted(by_cores.items()):
        have = "has" if len(names) == 1 else "have"
        scaling = scaling_of(profile, cores)
        how = "interpolated" if scaling == SCALING else "extrapolated"
        timed = (f"profiled with {profile.threads} thread{'s' * (profile.threads != 1)}"
                 if len(counts) == 1 else f"timed at {', '.join(map(str, counts))} threads")
        notes.append(f"{', '.join(names)} {have} {cores} core{'s' * (cores != 1)}, but the graph "
                     f"was {timed}: {'its' if len(names) == 1 else 'their'} op times are "
                     f"{how} (scaling: {scaling})")
    return tuple(notes)
