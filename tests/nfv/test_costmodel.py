"""FlowShader's cost model and batch sizer against closed forms."""

from __future__ import annotations

import numpy as np

from dl_nfv.nfv.engines.costmodel import BatchSizer, CostModel, candidates, nnls


def test_nnls_recovers_rates_and_clips_negative():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 100, size=(40, 3))
    true = np.array([2e-6, 0.0, 5e-4])
    coef = nnls(np.c_[x, np.ones(40)], x @ true + 1e-3)
    assert np.allclose(coef, [*true, 1e-3], rtol=1e-6, atol=1e-12)
    assert (nnls(x, -x[:, 0]) >= 0).all()


def test_split_minimises_max_of_both_sides():
    model = CostModel(threads=1 << 30, calibration_batches=1)
    model.gpu_coef = np.array([1e-3, 0.0, 0.0, 0.0])  # a step per padded byte
    model.cpu_coef = np.array([0.0, 1e-4, 0.0])  # per byte on the CPU
    model.enq_coef = np.zeros(2)
    model.fits = 1
    load = np.array([10, 10, 10, 10, 1000, 5000], dtype=float)
    msgs = np.ones(6)
    i, mode = model.split(5, load, msgs)
    c = candidates(load, msgs, model.threads)
    costs = np.maximum(1e-3 * c.steps * c.waves, 1e-4 * c.cpu_bytes)
    assert mode == "model" and i == int(np.argmin(costs)) == 4  # the two big flows on the CPU
    assert candidates(load, msgs, 2).waves.tolist() == [0, 1, 2, 2, 3, 3, 4]


def test_calibration_then_model_and_reprofiling():
    model = CostModel(threads=1 << 30, calibration_batches=3, reprofile_every=8)
    load, msgs = np.arange(1, 101, dtype=float), np.ones(100)
    splits = []
    for b in range(19):
        i, mode = model.split(b, load, msgs)
        splits.append((i, mode))
        c = candidates(load, msgs, model.threads)
        model.observe(steps=c.steps[i], waves=c.waves[i], gpu_bytes=c.gpu_bytes[i],
                      gpu_msgs=c.gpu_msgs[i], cpu_bytes=c.cpu_bytes[i], cpu_msgs=c.cpu_msgs[i],
                      gpu_s=1e-5 * c.steps[i] + 2e-5 * c.gpu_msgs[i],
                      cpu_s=1e-6 * c.cpu_bytes[i], enqueue_s=0.0)
        model.observe_wall(mode, 100, {"gpu": 3e-3, "cpu": 5e-3}.get(mode, 1e-3))
    assert [m for _, m in splits[:3]] == ["calibrate"] * 3
    assert [i for i, _ in splits[:3]] == [50, 25, 75]
    c = candidates(load, msgs, model.threads)
    true = np.maximum(1e-5 * c.steps + 2e-5 * c.gpu_msgs, 1e-6 * c.cpu_bytes)
    assert np.allclose(model.predict(c), true, rtol=1e-6)
    best = int(np.argmin(true))
    viable_gpu = 1e-5 * c.steps[100] <= 4 * true[best]
    assert splits[3] == (best, "model")
    assert splits[8] == (50, "reprofile") and splits[16][1] == "reprofile"
    tried = {m for _, m in splits}
    assert ("gpu" in tried) == viable_gpu and "cpu" in tried
    assert all(m == "model" for _, m in splits[11:16])  # the split measured fastest


def test_fastest_measured_policy_wins_and_hopeless_extremes_are_not_tried():
    model = CostModel(threads=1 << 30, calibration_batches=1, reprofile_every=0)
    model.fits = 1
    model.gpu_coef = np.array([0.0, 0.0, 0.5e-6, 0.0])
    model.cpu_coef = np.array([1e-6, 0.0, 0.0])
    for mode, wall in (("model", 5e-3), ("gpu", 1e-3), ("cpu", 9e-3)):
        model.observe_wall(mode, 100, wall)
    assert model.split(3, np.ones(4), np.ones(4)) == (4, "gpu")
    model.gpu_coef = np.array([1.0, 0.0, 0.0, 0.0])  # a huge step cost: all-GPU is hopeless
    assert model.split(4, np.ones(4), np.ones(4))[1] != "gpu"


def test_batch_sizer_reverses_after_two_drops():
    sizer = BatchSizer(1024, step=32, every=1)
    sizes = [sizer.observe(m, 1.0) for m in (100, 200, 150, 120, 130)]
    assert sizes == [1056, 1088, 1120, 1088, 1056]
