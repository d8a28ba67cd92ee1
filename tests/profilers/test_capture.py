"""Graph capture: op ids, the op -> fx node mapping, layers, determinism, untraceable models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dl_nfv.artifacts import Granularity
from dl_nfv.profilers import zoo
from dl_nfv.profilers.capture import UntraceableModel, capture, layer_modules


def _build(name: str):
    workload = zoo.instantiate(zoo.model_ref(name), seed=0)
    inputs, _ = workload.make_batch(2, seed=0)
    return workload.module, inputs


def _check_partition(cap):
    """Every non-output fx node belongs to exactly one op, and op_ids are in graph order."""
    nodes = [n for n in cap.graph_module.graph.nodes if n.op != "output"]
    assert sorted(cap.op_of) == sorted(n.name for n in nodes)
    assert sum(len(v) for v in cap.nodes_of.values()) == len(nodes)
    position = {n.name: i for i, n in enumerate(nodes)}
    compute = {op: [position[n.name] for n in cap.nodes(op) if n.op != "get_attr"]
               for op in cap.op_ids}
    first = [min(compute[op]) for op in cap.op_ids]
    assert first == sorted(first)
    if cap.granularity is Granularity.LAYER:  # layers are contiguous runs of nodes
        for op in cap.op_ids:
            run = sorted(position[x] for x in cap.nodes_of[op])
            assert run == list(range(run[0], run[0] + len(run)))


@pytest.mark.parametrize("name", ["resnet50-tiny", "gpt2-tiny", "gnmt-tiny", "inception-v3-tiny"])
def test_op_granularity_ids_are_fx_node_names(name):
    module, inputs = _build(name)
    cap = capture(module, inputs, granularity="op")
    _check_partition(cap)
    for op in cap.op_ids:
        compute = [n for n in cap.nodes(op) if n.op != "get_attr"]
        assert len(compute) == 1 and compute[0].name == op
    assert cap.input_ops == tuple(n.name for n in cap.graph_module.graph.nodes
                                  if n.op == "placeholder")


def test_layer_granularity_ids_are_module_names():
    module, inputs = _build("resnet50-tiny")
    cap = capture(module, inputs, granularity=Granularity.LAYER)
    _check_partition(cap)
    assert cap.op_ids == ("x", "conv1", "bn1", "layer1.0", "layer2.0", "layer3.0", "layer4.0", "fc")
    # relu and maxpool (no parameters) join bn1; avgpool and flatten join the last block.
    assert [n.target for n in cap.nodes("bn1")] == ["bn1", "relu", "maxpool"]
    assert cap.modules_of["layer1.0"] == ("layer1.0",)


def test_layers_of_transformer_models_are_blocks():
    module, _ = _build("gpt2-tiny")
    assert layer_modules(module) >= {"wte", "wpe", "h.0", "h.1", "ln_f"}
    module, _ = _build("bert-tiny")
    assert {"embeddings", "encoder.0", "encoder.1", "mlm"} <= layer_modules(module)
    module, _ = _build("gnmt-tiny")
    assert {"encoder.bidirectional", "encoder.layers.0", "decoder.attention",
            "decoder.classifier"} <= layer_modules(module)


def test_capture_is_deterministic():
    module, inputs = _build("transformer-tiny")
    a = capture(module, inputs, granularity="op")
    b = capture(zoo.instantiate(zoo.model_ref("transformer-tiny"), seed=5).module, inputs,
                granularity="op")
    assert a.op_ids == b.op_ids and a.nodes_of == b.nodes_of
    assert str(a.graph_module.graph) == str(b.graph_module.graph)


def test_graph_module_computes_what_the_module_computes():
    module, inputs = _build("gnmt-tiny")
    module.eval()
    for granularity in ("op", "layer"):
        cap = capture(module, inputs, granularity=granularity)
        torch.testing.assert_close(cap.graph_module(*inputs), module(*inputs))


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return self.fc(x)
        return -x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.blocks = nn.Sequential(Gate(), Gate())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_untraceable_module_is_named_with_the_options_that_avoid_it():
    with pytest.raises(UntraceableModel) as info:
        capture(Net(), (torch.ones(2, 4),), granularity="op")
    message = str(info.value)
    assert "module 'blocks.0' (Gate)" in message
    assert "--granularity layer" in message and "--leaf blocks.0" in message
    # Both options do avoid it.
    cap = capture(Net(), (torch.ones(2, 4),), granularity="layer")
    assert cap.op_ids == ("x", "stem", "blocks.0", "blocks.1", "head")
    cap = capture(Net(), (torch.ones(2, 4),), granularity="op", leaf_modules=["Gate"])
    assert "blocks_0" in cap.op_ids


def test_untraceable_root_forward_says_no_granularity_helps():
    with pytest.raises(UntraceableModel, match=r"Branchy.forward itself\); no granularity avoids it"):
        capture(Branchy(), (torch.ones(2),))


def test_wrong_number_of_inputs_and_unknown_leaf_are_bad_input():
    module, inputs = _build("mlp-tiny")
    with pytest.raises(Exception, match="takes 1 inputs, got 2"):
        capture(module, (*inputs, *inputs))
    with pytest.raises(Exception, match="--leaf 'nope'"):
        capture(module, inputs, leaf_modules=["nope"])
