"""The batch loop's settings are the nf-config's engine record: one set of fields, defaults
and checks, whether they come from a config file or are given in code."""

from __future__ import annotations

import dataclasses

import pytest

from dl_nfv.artifacts.nfconfig import EngineSpec
from dl_nfv.nfv.engines.runner import EngineOptions
from dl_nfv.nfv.run import engine_options, load_config
from tests.conftest import EXAMPLES


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("workers", -1), ("device", "tpu"),
                                         ("calibration_batches", 0), ("torch_threads", 0)])
def test_settings_given_in_code_are_checked_like_a_configs(field, value):
    with pytest.raises(ValueError, match=field):
        EngineOptions(**{field: value})


def test_a_configs_engine_is_what_the_loop_runs_with():
    config = load_config(EXAMPLES / "nf" / "ids.yaml")
    options = engine_options(config, batch_size=512)
    loop_fields = [f.name for f in dataclasses.fields(EngineSpec) if f.name != "name"]
    expected = {**{n: getattr(config.engine, n) for n in loop_fields}, "batch_size": 512}
    assert {n: getattr(options, n) for n in loop_fields} == expected
    assert EngineOptions().batch_size == EngineSpec().batch_size
