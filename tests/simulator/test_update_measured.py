"""The optimizer step, the gradients' zeroing and a backward's adding into them as the profile
timed them (``ProfileInfo.update_ns_per_byte``, ``zero_ns_per_byte``,
``accumulate_ns_per_byte``): charged per parameter byte on CPU devices of the profile's type,
the memory-pass model elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts import Optimizer, ProfileInfo
from dl_nfv.simulator import CostModel, simulate
from dl_nfv.simulator.costs import ACCUMULATE_PASSES, UPDATE_PASSES, ZERO_PASSES
from dl_nfv.simulator.tasks import TaskKind

from .helpers import chain, mesh, one_group, plan

PARAM_BYTES = 4_000_000
RATES = {"sgd": 0.2, "adam": 0.3}  # ns per parameter byte
ZERO = 0.05
ADD = 0.03


def _graph(rates, zero, accumulate=None):
    g = chain(2, 2.0, 4.0, param_bytes=PARAM_BYTES, batch_size=8)
    ops = tuple(dataclasses.replace(o, fwd_ms={"cpu": 2.0}, bwd_ms={"cpu": 4.0}) for o in g.ops)
    return dataclasses.replace(g, ops=ops, profile=ProfileInfo(
        device_type="cpu", update_ns_per_byte=rates, zero_ns_per_byte=zero,
        accumulate_ns_per_byte=accumulate))


@pytest.mark.parametrize("optimizer", [Optimizer.SGD, Optimizer.ADAM])
def test_measured_rates_on_the_profiles_cpu_type(optimizer):
    t = mesh(1, device_type="cpu")
    dev = t.device_names[0]
    cm = CostModel(_graph(RATES, ZERO), t)
    bandwidth = CostModel(_graph({}, None), t).cluster.device(dev).type.memory_bandwidth_gb_per_s * 1e6
    assert cm.update_ms_per_byte(dev, optimizer) == pytest.approx(RATES[optimizer.value] * 1e-6)
    assert cm.upkeep_ms_per_byte(dev, 0) == pytest.approx(ZERO * 1e-6)
    assert cm.upkeep_ms_per_byte(dev, 3) == pytest.approx(
        ZERO * 1e-6 + 3 * ACCUMULATE_PASSES / bandwidth)
    assert cm.update_ms(1e6, dev, optimizer) == pytest.approx(
        cm.update_launch_ms(dev) + RATES[optimizer.value])


def test_without_measurements_or_on_another_type_the_memory_passes():
    cpu, gpu = mesh(1, device_type="cpu"), mesh(1)
    for g, t in [(_graph({}, None), cpu), (_graph(RATES, ZERO), gpu),
                 (_graph({"sgd": 0.2}, None), cpu)]:
        dev = t.device_names[0]
        bandwidth = CostModel(_graph({}, None), t).cluster.device(dev).type.memory_bandwidth_gb_per_s * 1e6
        cm = CostModel(g, t)
        adam = cm.update_ms_per_byte(dev, Optimizer.ADAM)
        assert adam == pytest.approx(UPDATE_PASSES[Optimizer.ADAM] / bandwidth)
        if g.profile.zero_ns_per_byte is None:
            assert cm.upkeep_ms_per_byte(dev, 0) == pytest.approx(ZERO_PASSES / bandwidth)


def test_the_simulated_update_task_takes_the_measured_step_and_zeroing():
    t = mesh(1, device_type="cpu")
    g = _graph(RATES, ZERO)
    result = simulate(plan(g, t, [one_group(g, t.device_names)]), g, t)
    tg = result.tasks
    (update,) = [tg.duration_ms[k] for k, kind in enumerate(tg.kind) if kind is TaskKind.UPDATE]
    nbytes = 2 * PARAM_BYTES
    cm = CostModel(g, t)
    assert update == pytest.approx(cm.update_launch_ms(t.device_names[0])
                                   + nbytes * (RATES["sgd"] + ZERO) * 1e-6)


def test_the_measured_adding_in_every_backward_and_in_the_upkeep():
    t = mesh(1, device_type="cpu")
    dev = t.device_names[0]
    cm = CostModel(_graph(RATES, ZERO, ADD), t)
    assert cm.accumulate_ms_per_byte(dev) == pytest.approx(ADD * 1e-6)
    assert cm.upkeep_ms_per_byte(dev, 3) == pytest.approx((ZERO + 3 * ADD) * 1e-6)
    g = _graph(RATES, ZERO, ADD)
    tg = simulate(plan(g, t, [one_group(g, t.device_names)]), g, t).tasks
    backs = [tg.duration_ms[k] for k, kind in enumerate(tg.kind) if kind is TaskKind.BACKWARD]
    # each op's backward adds its own parameters' gradient once (one microbatch)
    assert backs == pytest.approx([4.0 + PARAM_BYTES * ADD * 1e-6] * 2)
    # on another device type, the memory passes
    gpu = mesh(1)
    other = CostModel(g, gpu)
    bandwidth = other.cluster.device(gpu.device_names[0]).type.memory_bandwidth_gb_per_s * 1e6
    assert other.accumulate_ms_per_byte(gpu.device_names[0]) == pytest.approx(
        ACCUMULATE_PASSES / bandwidth)


def test_profile_info_refuses_unknown_optimizers_and_negative_rates():
    with pytest.raises(ValueError, match="update_ns_per_byte"):
        ProfileInfo(device_type="cpu", update_ns_per_byte={"rmsprop": 0.1})
    with pytest.raises(ValueError, match="update_ns_per_byte"):
        ProfileInfo(device_type="cpu", update_ns_per_byte={"sgd": -0.1})
    with pytest.raises(ValueError, match="zero_ns_per_byte"):
        ProfileInfo(device_type="cpu", zero_ns_per_byte=-1.0)
    with pytest.raises(ValueError, match="accumulate_ns_per_byte"):
        ProfileInfo(device_type="cpu", accumulate_ns_per_byte=-1.0)
