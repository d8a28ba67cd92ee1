"""The ``policy`` artifact: weights round-trip exactly, bad policies are refused, ``show`` renders it."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dl_nfv.artifacts import BadInput, InvalidArtifact, from_document, save
from dl_nfv.artifacts.io import plain_data
from dl_nfv.artifacts.policy import Policy, TrainedOn
from dl_nfv.cli.main import cli
from dl_nfv.planners.learned.coarsen import coarsen
from dl_nfv.planners.learned.encoder import GroupEncoder
from dl_nfv.planners.learned.features import FEATURE_SCHEMA_VERSION, group_graph
from dl_nfv.planners.learned.policy import load_weights, policy_of, read_policy
from dl_nfv.simulator.costs import CostModel
from tests.artifacts.fixtures import GRAPH, TOPOLOGY

ARCH = {"hidden": 16, "layers": 1, "heads": 2}


def _encoder(seed: int, **arch) -> GroupEncoder:
    torch.manual_seed(seed)
    return GroupEncoder(**{**ARCH, **arch})


def _policy(encoder: GroupEncoder) -> Policy:
    return policy_of(encoder, planner="heterog", architecture=ARCH,
                     trained_on=TrainedOn(graphs=("mlp-tiny",), topologies=("two-hosts",), episodes=3),
                     seed=1, command="dl-nfv plan learn heterog --episodes 3")


def test_weights_round_trip_bit_for_bit(tmp_path):
    trained = _encoder(1)
    path = save(_policy(trained), tmp_path / "p.policy.json")
    fresh = _encoder(2)
    load_weights(read_policy(path), fresh, planner="heterog")
    for name, tensor in trained.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[name]), name
    cm = CostModel(from_document(copy.deepcopy(GRAPH)), from_document(copy.deepcopy(TOPOLOGY)))
    gg = group_graph(cm, coarsen(cm, target=2))
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(trained(gg), fresh(gg)))


def test_weight_data_is_little_endian_float32_in_base64():
    encoder = _encoder(1)
    policy = _policy(encoder)
    w = next(w for w in policy.weights if w.name.endswith("weight"))
    values = np.frombuffer(base64.b64decode(w.data), dtype="<f4").reshape(w.shape)
    assert np.array_equal(values, encoder.state_dict()[w.name].numpy())
    assert policy.parameter_count == sum(t.numel() for t in encoder.state_dict().values())
    assert policy.feature_schema_version == FEATURE_SCHEMA_VERSION


def test_a_policy_of_another_schema_planner_or_shape_is_refused():
    policy = _policy(_encoder(1))
    other = dataclasses.replace(policy, feature_schema_version=FEATURE_SCHEMA_VERSION + 1)
    with pytest.raises(BadInput, match=f"feature schema {FEATURE_SCHEMA_VERSION + 1}; "
                                       f"this dl-nfv computes schema {FEATURE_SCHEMA_VERSION}"):
        load_weights(other, _encoder(2), planner="heterog")
    with pytest.raises(BadInput, match="for planner 'heterog', not 'tag'"):
        load_weights(policy, _encoder(2), planner="tag")
    with pytest.raises(BadInput, match=r"has shape \[16, 7\], the network's \[32, 7\]"):
        load_weights(policy, _encoder(2, hidden=32), planner="heterog")


def test_a_file_that_is_not_a_policy_is_refused(tmp_path):
    path = save(from_document(copy.deepcopy(TOPOLOGY)), tmp_path / "t.json")
    with pytest.raises(BadInput, match="not a policy"):
        read_policy(path)


def test_weights_whose_data_does_not_fit_their_shape_are_invalid():
    doc = json.loads(json.dumps(plain_data(_policy(_encoder(1)))))
    doc["weights"][0]["shape"] = [doc["weights"][0]["shape"][0] + 1, *doc["weights"][0]["shape"][1:]]
    with pytest.raises(InvalidArtifact, match="needs .* bytes, data holds"):
        from_document(doc)


def test_show_renders_the_header_and_tensors(tmp_path):
    path = save(_policy(_encoder(1)), tmp_path / "p.policy.json")
    result = CliRunner().invoke(cli, ["show", str(path), "--width", "120"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "policy for `plan heterog`" in out
    assert re.search(rf"feature schema\W+{FEATURE_SCHEMA_VERSION}\W", out)
    # device MLP 7x16+16 + 16x16+16 = 400; group MLP (21 + 2 x 16 inputs) 53x16+16 + 16x16+16
    # = 1136; one GATConv of 2 heads x 8: 16x16 + 3 x 16 attention + 16 edge + 16 bias = 336;
    # LayerNorm 32
    assert re.search(r"parameters\W+1,904\W", out)
    for text in ("hidden 16, layers 1, heads 2", "mlp-tiny", "two-hosts",
                 "dl-nfv plan learn heterog --episodes 3", "device_mlp.0.weight", "16 x 7"):
        assert text in out, text
