"""FlowShader's cost model, split decision and batch sizer against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from dl_nfv.nfv.engines.costmodel import (
    TRY_TIMES,
    BatchSizer,
    Candidates,
    CostModel,
    candidates,
    nnls,
    policy_class,
)

ONE_WAVE = 1 << 30


def _fitted(*, gpu=(0.0, 0.0, 0.0, 0.0), cpu=(0.0, 0.0, 0.0), enq=(0.0, 0.0), **kw) -> CostModel:
    model = CostModel(threads=ONE_WAVE, calibration_batches=1, reprofile_every=0, **kw)
    model.gpu_coef, model.cpu_coef, model.enq_coef = (np.array(gpu), np.array(cpu),
                                                      np.array(enq))
    model.fits = 1
    return model


def _at(c: Candidates, i: int) -> dict[str, float]:
    """The features of split ``i`` of a batch, as the engine reports them."""
    return {f: float(getattr(c, f)[i]) for f in Candidates.__slots__}


def _measured(model: CostModel, policy: str, c: Candidates, i: int, factor: float,
              times: int = 1) -> None:
    """``times`` batches of split ``i`` under ``policy`` took ``factor`` x the model."""
    for _ in range(times):
        model.observe_wall(policy, _at(c, i), factor * float(model.predict(c)[i]))


def test_nnls_recovers_rates_and_clips_negative():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 100, size=(40, 3))
    true = np.array([2e-6, 0.0, 5e-4])
    coef = nnls(np.c_[x, np.ones(40)], x @ true + 1e-3)
    assert np.allclose(coef, [*true, 1e-3], rtol=1e-6, atol=1e-12)
    assert (nnls(x, -x[:, 0]) >= 0).all()


def test_prediction_is_the_longest_of_main_thread_pool_and_shared_cores():
    model = _fitted(gpu=(1e-3, 0.0, 2e-4, 5e-3), cpu=(3e-4, 0.0, 1e-3), enq=(5e-5, 0.0),
                    workers=2, cores=2, shares_cores=True)
    load = np.array([1, 2, 3, 5, 8, 13], dtype=float)
    msgs = np.array([1, 1, 2, 2, 3, 4], dtype=float)
    c = candidates(load, msgs, ONE_WAVE)
    i = np.arange(7)
    gm = np.concatenate([[0], np.cumsum(msgs)])
    cm = msgs.sum() - gm
    steps = np.concatenate([[0], load])  # ascending: the longest is the last one taken
    t_gpu = np.where(i > 0, 1e-3 * steps + 2e-4 * gm + 5e-3, 0)
    t_cpu = np.where(i < 6, 3e-4 * cm + 1e-3, 0)
    t_enq = 5e-5 * cm
    want = np.maximum.reduce([t_enq + t_gpu, t_cpu / 2, (t_enq + t_gpu + t_cpu) / 2])
    assert np.allclose(model.predict(c), want, rtol=1e-12)
    model.shares_cores = False  # CUDA: the tensor path does not take CPU cores
    want = np.maximum.reduce([t_enq + t_gpu, t_cpu / 2, (t_enq + t_cpu) / 2])
    assert np.allclose(model.predict(c), want, rtol=1e-12)


@pytest.mark.parametrize("gpu_msg_s, cpu_msg_s, expected", [(1e-6, 3e-6, "gpu"),
                                                            (3e-6, 1e-6, "cpu")])
def test_no_real_parallelism_means_no_split(gpu_msg_s, cpu_msg_s, expected):
    """One core for both paths: any split costs the sum of both sides, so the cheaper
    path alone wins (a linear cost has its minimum at an extreme)."""
    model = _fitted(gpu=(0.0, 0.0, gpu_msg_s, 0.0), cpu=(cpu_msg_s, 0.0, 0.0), workers=2,
                    cores=1, shares_cores=True)
    load, msgs = np.arange(1, 41, dtype=float), np.full(40, 3.0)
    i, mode, predicted = model.split(5, load, msgs)
    assert mode == expected and i == (40 if expected == "gpu" else 0)
    assert predicted == pytest.approx(120 * min(gpu_msg_s, cpu_msg_s))


def test_separate_hardware_balances_both_paths():
    """CUDA (the GPU does not take CPU cores): a GPU at 1 us and a one-worker pool at
    3 us per message share 4000 equal messages 3:1, T = 3 ms on both sides."""
    model = _fitted(gpu=(0.0, 0.0, 1e-6, 0.0), cpu=(3e-6, 0.0, 0.0), workers=1, cores=2,
                    shares_cores=False)
    load, msgs = np.ones(4000), np.ones(4000)
    c = candidates(load, msgs, ONE_WAVE)
    for policy, i in (("cpu", 0), ("model", 1000), ("gpu", 4000)):  # measured as modelled
        _measured(model, policy, c, i, 1.0, TRY_TIMES)
    i, mode, predicted = model.split(5, load, msgs)
    assert (i, mode) == (3000, "model") and predicted == pytest.approx(3e-3)
    # the same rates with the tensor path on the CPU, and 1.5 cores measured for both:
    # max(g, (g + 3 (4000 - g)) / 1.5) is least at g = 8000 / (7/3) = 3428.6 (in us)
    model.shares_cores = True
    model.parallel_samples.append(1.5)
    i, mode, predicted = model.split(6, load, msgs)
    assert (i, mode) == (3429, "model") and predicted == pytest.approx(3.429e-3)


def test_big_flows_go_to_the_cpu_when_padding_makes_them_expensive():
    model = _fitted(gpu=(1e-3, 0.0, 0.0, 0.0), cpu=(0.0, 1e-4, 0.0), workers=1, cores=4,
                    shares_cores=False)
    load = np.array([10, 10, 10, 10, 1000, 5000], dtype=float)
    msgs = np.ones(6)
    i, mode, _ = model.split(5, load, msgs)
    c = candidates(load, msgs, ONE_WAVE)
    costs = np.maximum(1e-3 * c.steps, 1e-4 * c.cpu_bytes)
    assert mode == "model" and i == int(np.argmin(costs)) == 4  # the two big flows on the CPU
    assert candidates(load, msgs, 2).waves.tolist() == [0, 1, 2, 2, 3, 3, 4]


def test_measured_parallelism_is_the_busiest_batch_within_the_cores():
    model = CostModel(threads=ONE_WAVE, workers=2, cores=2, shares_cores=True)
    assert model.parallel() == 2.0  # before any sample: the cores
    kw0 = {"steps": 1.0, "waves": 1.0, "gpu_bytes": 1.0, "cpu_bytes": 1.0, "cpu_msgs": 1.0}
    model.observe(gpu_msgs=1, gpu_s=0.1, cpu_s=0.1, enqueue_s=0.0, wall_s=0.1, **kw0)
    assert model.parallel() == 2.0 and model.fits == 0  # the first batch is not sampled
    kw = {"steps": 1.0, "waves": 1.0, "gpu_bytes": 1.0, "cpu_bytes": 1.0, "cpu_msgs": 1.0}
    model.observe(gpu_msgs=1, gpu_s=0.004, cpu_s=0.004, enqueue_s=0.002, wall_s=0.008, **kw)
    model.observe(gpu_msgs=1, gpu_s=0.002, cpu_s=0.004, enqueue_s=0.0, wall_s=0.005, **kw)
    assert model.parallel() == pytest.approx(1.25)  # 10/8 and 6/5 CPU s per wall s
    model.observe(gpu_msgs=0, gpu_s=0.0, cpu_s=0.009, enqueue_s=0.001, wall_s=0.004, **kw)
    assert model.parallel() == pytest.approx(1.25)  # one path alone says nothing about it
    model.observe(gpu_msgs=1, gpu_s=0.01, cpu_s=0.01, enqueue_s=0.0, wall_s=0.005, **kw)
    assert model.parallel() == 2.0  # 4 CPU s per wall s, but only 2 cores


def test_wall_time_corrections_steer_and_are_forgotten_at_reprofiling():
    model = _fitted(gpu=(0.0, 0.0, 1e-6, 0.0), cpu=(2e-6, 0.0, 0.0), workers=2, cores=1)
    model.reprofile_every = 10
    load, msgs = np.ones(100), np.ones(100)
    c = candidates(load, msgs, ONE_WAVE)
    i, mode, predicted = model.split(1, load, msgs)
    assert (i, mode) == (100, "gpu") and predicted == pytest.approx(1e-4)
    _measured(model, "gpu", c, 100, 3.0, TRY_TIMES)  # 3x the model: cpu (2x) is better
    assert model.corrections() == {"gpu": pytest.approx(3.0)}
    i, mode, predicted = model.split(2, load, msgs)  # next at its model cost: one flow off
    assert (i, mode) == (99, "model") and predicted == pytest.approx(1.01e-4)
    _measured(model, "model", c, 99, 3.0, TRY_TIMES)  # as slow: cpu is tried
    i, mode, predicted = model.split(2, load, msgs)
    assert (i, mode) == (0, "cpu") and predicted == pytest.approx(2e-4)
    _measured(model, "cpu", c, 0, 1.0, TRY_TIMES)
    _measured(model, "gpu", c, 100, 1.2, 2)  # two later gpu batches: median of 3, 1.2, 1.2
    assert model.corrections()["gpu"] == pytest.approx(1.2)
    assert model.split(3, load, msgs)[:2] == (100, "gpu")  # 1.2e-4 beats cpu's 2e-4
    assert model.split(10, load, msgs)[1] == "reprofile"
    assert model.corrections() == {"gpu": pytest.approx(1.2)}  # the others forgotten
    assert model.split(11, load, msgs)[:2] == (99, "model")  # re-tried at its model cost


def test_corrections_are_ratios_to_the_current_fit():
    """A refit re-prices the batches a class ran: the correction is the median of their
    wall times over what the current rates predict for them, not over stale predictions."""
    model = _fitted(gpu=(0.0, 0.0, 1e-6, 0.0), cpu=(2e-6, 0.0, 0.0), workers=2, cores=1)
    c = candidates(np.ones(100), np.ones(100), ONE_WAVE)
    for wall in (2e-4, 1e-4, 9e-4):  # 2x, 1x and 9x the model's 1e-4: the median is 2x
        model.observe_wall("gpu", _at(c, 100), wall)
    assert model.corrections()["gpu"] == pytest.approx(2.0)
    model.gpu_coef = np.array([0.0, 0.0, 2e-6, 0.0])  # refitted: twice the cost per message
    assert model.corrections()["gpu"] == pytest.approx(1.0)
    model.observe_wall("gpu", _at(c, 100), 6e-4)  # the last 3 of 2e-4: 0.5x, 4.5x, 3x
    assert model.corrections()["gpu"] == pytest.approx(3.0)


def test_a_class_is_tried_until_measured_twice_when_close():
    """An untried class within 1.5x of the least corrected cost is run, and run again
    after one batch: a class's first batch may pay one-time costs."""
    model = _fitted(gpu=(0.0, 0.0, 1.2e-6, 0.0), cpu=(1e-6, 0.0, 0.0), workers=2, cores=1)
    load, msgs = np.ones(10), np.ones(10)
    c = candidates(load, msgs, ONE_WAVE)
    _measured(model, "cpu", c, 0, 1.0, TRY_TIMES)
    _measured(model, "model", c, 1, 1.0, TRY_TIMES)
    # gpu: 1.2e-5 at its model cost, within 1.5x of cpu's 1e-5 and never measured: tried
    assert model.split(1, load, msgs)[:2] == (10, "gpu")
    _measured(model, "gpu", c, 10, 1.2)  # a slow first batch (1.44e-5): tried once more
    assert model.split(2, load, msgs)[:2] == (10, "gpu")
    _measured(model, "gpu", c, 10, 0.5)  # median of 1.2 and 0.5: 0.85 x 1.2e-5 > 1e-5
    assert model.split(3, load, msgs)[:2] == (0, "cpu")
    model.walls["gpu"].clear()
    model.gpu_coef = np.array([0.0, 0.0, 2e-6, 0.0])  # 2e-5 is 2x cpu's cost: not worth a try
    assert model.split(4, load, msgs)[:2] == (0, "cpu")


def test_untried_classes_are_explored_one_batch_each_even_before_measured():
    """With double buffering a batch is split before the one ahead is measured: a class
    chosen to be tried and not measured yet is not tried again meanwhile."""
    model = _fitted(gpu=(0.0, 0.0, 1.2e-6, 0.0), cpu=(1e-6, 0.0, 0.0), workers=2, cores=1)
    load, msgs = np.ones(10), np.ones(10)
    c = candidates(load, msgs, ONE_WAVE)
    tried = [model.split(b, load, msgs)[1] for b in (1, 2, 3)]
    assert tried == ["cpu", "model", "gpu"]  # cheapest first: 1e-5, 1.02e-5, 1.2e-5
    for mode, i in zip(tried, (0, 1, 10)):
        _measured(model, mode, c, i, 1.0, TRY_TIMES)
    assert model.split(4, load, msgs)[1] == "cpu"


def test_without_a_stepped_kernel_no_step_rate_is_fitted():
    """The HTTP chain's kernels do not wait for the longest stream: batches whose longest
    stream grows with their messages must not teach the model a per-step cost."""
    model = CostModel(threads=ONE_WAVE, calibration_batches=1, reprofile_every=0,
                      workers=2, stepped=False)
    for msgs in (100.0, 200.0, 400.0, 300.0):
        model.observe(steps=10 * msgs + (50 if msgs == 300 else 0), waves=1.0,
                      gpu_bytes=1000 * msgs + (7e3 if msgs == 200 else 0), gpu_msgs=msgs,
                      cpu_bytes=0.0, cpu_msgs=0.0, gpu_s=2e-6 * msgs + 1e-4, cpu_s=0.0,
                      enqueue_s=0.0)
    assert model.gpu_coef[0] == 0.0
    assert model.gpu_coef[1:].tolist() == pytest.approx([0.0, 2e-6, 1e-4], abs=1e-12)


def test_probe_split_takes_a_message_share_and_caps_the_padding():
    model = CostModel(threads=ONE_WAVE, workers=2)
    load = np.array([1, 1, 1, 1, 2, 2, 100], dtype=float)
    msgs = np.array([1, 1, 1, 1, 2, 2, 8], dtype=float)
    # half of the 16 messages: the smallest flows up to the 8th message (flows 0-5)
    assert model.probe_split(0.5, load, msgs) == 6
    assert model.probe_split(0.25, load, msgs) == 4
    assert model.probe_split(0.75, load, msgs) == 6  # never every flow: both sides measured
    model.step_floor_s = 1e-6  # a stepped kernel: rows x longest <= 4 x the real steps
    assert model.probe_split(0.75, load, msgs, steps=load) == 6  # 6 * 2 <= 4 * 8
    # 5 rows x 30 steps > 4 x 34 real steps: the probe stops at 4 flows, not 5
    assert model.probe_split(0.75, np.array([1, 1, 1, 1, 30, 1000.0]), np.ones(6)) == 4


def test_calibration_then_model_then_reprofiling():
    model = CostModel(threads=ONE_WAVE, calibration_batches=3, reprofile_every=8, workers=2,
                      cores=2, shares_cores=True)
    load, msgs = np.arange(1, 101, dtype=float), np.arange(100) % 3 + 1.0
    c = candidates(load, msgs, model.threads)
    modes, seen = [], 0
    for b in range(18):
        i, mode, _ = model.split(b, load, msgs)
        modes.append(mode)
        if b >= 1:  # double buffering: a batch is observed after the next one is split
            j = seen
            model.observe(steps=c.steps[j], waves=c.waves[j], gpu_bytes=c.gpu_bytes[j],
                          gpu_msgs=c.gpu_msgs[j], cpu_bytes=c.cpu_bytes[j],
                          cpu_msgs=c.cpu_msgs[j], gpu_s=1e-5 * c.steps[j] + 2e-5 * c.gpu_msgs[j],
                          cpu_s=1e-6 * c.cpu_bytes[j], enqueue_s=0.0, wall_s=1.0)
        seen = i
    # three preset probes and a fourth: batch 3 is split when batches 0 and 1 were
    # measured, and batch 0 (one-time costs) is not sampled; batch 4 after the first fit
    assert modes[:4] == ["calibrate"] * 4 and modes[8] == modes[16] == "reprofile"
    assert set(modes[4:8]) <= {"cpu", "model", "gpu"}
    t_gpu = np.where(c.gpu_msgs > 0, 1e-5 * c.steps + 2e-5 * c.gpu_msgs, 0)
    assert np.allclose(model.gpu_coef[[0, 2]], [1e-5, 2e-5], rtol=1e-6)
    assert np.allclose(model.cpu_coef, [0.0, 1e-6, 0.0], atol=1e-12)
    want = np.maximum(t_gpu, (t_gpu + 1e-6 * c.cpu_bytes) / model.parallel())
    assert np.allclose(model.predict(c), np.maximum(want, 1e-6 * c.cpu_bytes / 2), rtol=1e-6)


def test_policy_class():
    assert [policy_class(i, 3) for i in range(4)] == ["cpu", "model", "model", "gpu"]


def test_batch_sizer_reverses_after_two_drops_and_resets():
    sizer = BatchSizer(1024, step=32, every=1)
    sizes = [sizer.observe(m, 1.0) for m in (100, 200, 150, 120, 130)]
    assert sizes == [1056, 1088, 1120, 1088, 1056]
    sizer.reset()  # a new policy: the next window is not compared with the old one
    assert sizer.observe(10, 1.0) == 1024 and sizer.drops == 0
