"""Pipeline schedules as data: generators, text and CSV round trips, checks, torch's validator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import Action
from dl_nfv.planners.schedules import Schedule, gpipe, one_f_one_b, schedule_kind_of


def test_gpipe_text_by_hand():
    s = gpipe(2, 3)
    assert s.texts() == ("0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2")
    assert s.max_in_flight() == (3, 3)


def test_1f1b_text_by_hand():
    s = one_f_one_b(3, 4)
    assert s.texts() == ("0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
                         "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                         "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3")
    assert s.max_in_flight() == (3, 2, 1)
    assert schedule_kind_of(s) == "1f1b" and schedule_kind_of(gpipe(3, 4)) == "gpipe"


def test_1f1b_with_fewer_microbatches_than_stages():
    s = one_f_one_b(4, 2)
    assert s.texts()[0] == "0F0 0F1 0B0 0B1"
    assert s.deadlock_free()


@settings(max_examples=60, deadline=None)
@given(stages=st.integers(1, 7), microbatches=st.integers(1, 9), which=st.sampled_from(["g", "1"]))
def test_round_trips_and_deadlock_freedom(stages, microbatches, which):
    s = (gpipe if which == "g" else one_f_one_b)(stages, microbatches)
    assert Schedule.from_texts(s.texts(), microbatches) == s
    assert Schedule.from_csv(s.to_csv(), microbatches) == s
    assert s.deadlock_free()
    assert max(s.max_in_flight()) <= microbatches


def test_invalid_orders_are_named():
    with pytest.raises(ValueError, match="0B0 comes before 0F0"):
        Schedule.from_texts(["0B0 0F0"], 1)
    with pytest.raises(ValueError, match="lacks action 0B1"):
        Schedule.from_texts(["0F0 0F1 0B0"], 2)
    with pytest.raises(ValueError, match="appears twice"):
        Schedule.from_texts(["0F0 0F0 0B0"], 1)
    with pytest.raises(ValueError, match="belongs to stage 1"):
        Schedule.from_texts(["1F0 1B0"], 1)


def test_deadlock_is_detected():
    # stage 0 waits for B0 from stage 1 before sending F1; stage 1 wants F1 first
    s = Schedule.from_texts(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"], 2)
    assert s.dry_run() is not None and "0B0" in s.dry_run()
    assert not s.deadlock_free()


def test_device_schedules_and_back():
    from dl_nfv.artifacts import Group, Pipeline

    s = one_f_one_b(2, 2)
    per_device = s.device_schedules([("a", "b"), ("c",)])
    assert per_device == {"a": s.texts()[0], "b": s.texts()[0], "c": s.texts()[1]}
    groups = [Group(id="s0", ops=("x",), devices=("a", "b")), Group(id="s1", ops=("y",), devices=("c",))]
    pipe = Pipeline(microbatches=2, stages=("s0", "s1"), schedule=per_device)
    assert Schedule.from_pipeline(pipe, groups) == s


def test_torch_pipelining_accepts_our_csv(tmp_path):
    """torch.distributed.pipelining parses, validates and dry-runs our CSV without deadlock."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    s = one_f_one_b(4, 6)
    rows = [[schedules._Action.from_str(cell) for cell in line.split(",")]
            for line in s.to_csv().splitlines()]
    actions = dict(enumerate(rows))
    mapping = schedules._validate_schedule(actions, 4, 4, 6)
    assert mapping == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [str(a) for a in rows[2]] == list(s.texts()[2].split())
    with_comms = schedules._add_send_recv(actions, stage_to_rank=lambda st: st, num_stages=4)
    schedules._simulate_comms_compute(with_comms, stage_to_rank=lambda st: st, num_stages=4)
    assert Action(0, "F", 0) in s.orders[0]


@pytest.mark.parametrize("text,m,problem", [
    ("0F0 0I0 0W0", 1, None),
    ("0F0 0I0 0F1 0B1 0W0", 2, None),
    ("0F0 0W0 0I0", 1, "0W0 comes before 0I0"),
    ("0I0 0F0 0W0", 1, "0I0 comes before 0F0"),
    ("0F0 0I0", 1, "lacks action 0W0"),
    ("0F0 0B0 0I0 0W0", 1, "0I0 and 0B0 both run the microbatch's backward"),
    ("0F0 0I0 0B0", 1, "0B0 and 0I0 both run the microbatch's backward"),
    ("0F0 0I0 0W0 0W0", 1, "action 0W0 appears twice"),
])
def test_a_backward_split_in_input_and_weight_gradients_is_checked(text, m, problem):
    if problem is None:
        schedule = Schedule.from_texts([text], m)
        assert schedule.texts() == (text,)
        assert schedule.dry_run() is None
        assert schedule.max_in_flight() == (m,)  # a microbatch's activations stay until its W
    else:
        with pytest.raises(ValueError, match=problem):
            Schedule.from_texts([text], m)


def test_a_stage_s_input_gradients_let_the_stage_before_run_its_backward():
    # stage 1 sends its gradient after its I; its W may come after stage 0's backward
    assert Schedule.from_texts(["0F0 0F1 0B0 0B1", "1F0 1I0 1F1 1I1 1W0 1W1"], 2).dry_run() is None
    # stage 0 runs F1 only after B0, which needs stage 1's I0, which stage 1 runs after I1,
    # which needs F1
    stuck = Schedule.from_texts(["0F0 0B0 0F1 0B1", "1F0 1F1 1I1 1I0 1W0 1W1"], 2)
    assert stuck.dry_run() == "the schedule deadlocks: stages wait at 0B0, 1F1"
