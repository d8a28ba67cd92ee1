"""The model zoo: published parameter counts, deterministic builds, batches of any size."""

from __future__ import annotations

import pytest
import torch

from dl_nfv.artifacts import BadInput, UnknownName
from dl_nfv.profilers import zoo

# Published parameter counts (torchvision / Hugging Face / MLPerf reference implementations).
PUBLISHED = {
    "vgg19": 143_667_240,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "inception-v3": 23_834_568,  # torchvision inception_v3 without the auxiliary classifier
    "mobilenet-v2": 3_504_872,
    "bert-base": 109_514_298,  # BertForMaskedLM (bert-base-uncased)
    "bert-large": 335_174_458,  # BertForMaskedLM (bert-large-uncased)
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gnmt": 160_671_297,  # MLPerf GNMT-v2, shared embedding
}


def transformer_base_params(vocab=37000, d=512, ff=2048, layers=6) -> int:
    attention = 4 * (d * d + d)
    ffn = d * ff + ff + ff * d + d
    norm = 2 * d
    encoder = attention + ffn + 2 * norm
    decoder = 2 * attention + ffn + 3 * norm
    return vocab * d + layers * (encoder + decoder)


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_parameter_counts_match_published_models(name, count):
    assert zoo.parameter_count(name) == count


def test_transformer_and_mlp_counts_match_closed_forms():
    assert zoo.parameter_count("transformer") == transformer_base_params()
    # Vaswani et al. report ~65M for the base model; the closed form is within 5% of it.
    assert abs(transformer_base_params() - 65e6) / 65e6 < 0.05
    assert zoo.parameter_count("mlp") == 784 * 2048 + 2048 + 2 * (2048 * 2048 + 2048) + 2048 * 10 + 10


def test_bert_large_and_gpt2_xl_sizes_as_in_the_issue():
    assert abs(zoo.parameter_count("bert-large") - 335e6) / 335e6 < 0.01
    assert abs(zoo.parameter_count("gpt2-xl") - 1.56e9) / 1.56e9 < 0.01


def test_every_model_has_a_tiny_variant_and_aliases_resolve():
    full = [n for n in zoo.ZOO if not n.endswith(zoo.TINY)]
    assert len(full) == 15
    for name in full:
        assert name + zoo.TINY in zoo.ZOO
    assert zoo.lookup("gpt2-tiny").name == "gpt2-small-tiny"
    assert zoo.lookup("bert-tiny").name == "bert-base-tiny"


def test_unknown_model_lists_the_zoo():
    with pytest.raises(UnknownName, match="resnet50"):
        zoo.lookup("resnet51")


@pytest.mark.parametrize("name", ["resnet50-tiny", "gpt2-tiny", "gnmt-tiny", "transformer-tiny"])
def test_instantiate_is_deterministic_in_the_seed(name):
    ref = zoo.model_ref(name)
    a = zoo.instantiate(ref, seed=3).module.state_dict()
    b = zoo.instantiate(ref, seed=3).module.state_dict()
    c = zoo.instantiate(ref, seed=4).module.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_instantiate_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    zoo.instantiate(zoo.model_ref("mlp-tiny"), seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", ["vgg19-tiny", "bert-tiny", "gnmt-tiny"])
@pytest.mark.parametrize("batch", [1, 3])
def test_make_batch_any_batch_size_runs_and_gives_a_loss(name, batch):
    workload = zoo.instantiate(zoo.model_ref(name), seed=0)
    inputs, target = workload.make_batch(batch, seed=1)
    assert all(t.shape[0] == batch for t in inputs)
    assert target.shape[0] == batch
    out = workload.module(*inputs)
    loss = workload.loss(out, target)
    assert loss.dim() == 0 and torch.isfinite(loss)
    # Same seed, same batch.
    again, target2 = workload.make_batch(batch, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(inputs, again)) and torch.equal(target, target2)


def test_token_inputs_stay_inside_the_vocabulary():
    workload = zoo.instantiate(zoo.model_ref("gpt2-tiny", seq_len=16), seed=0)
    (tokens,), target = workload.make_batch(64, seed=0)
    assert tokens.dtype == torch.int64 and tokens.shape == (64, 16)
    assert 0 <= int(tokens.min()) and int(tokens.max()) < workload.vocab
    assert int(target.max()) < workload.vocab


def test_model_ref_for_zoo_models():
    ref = zoo.model_ref("resnet50", batch_size=32)
    assert ref.batch_size == 32 and ref.inputs[0].shape == (32, 3, 224, 224)
    ref = zoo.model_ref("transformer", batch_size=2, seq_len=10)
    assert [s.shape for s in ref.inputs] == [(2, 10), (2, 10)]
    assert ref.options == {"seq_len": 10}
    assert zoo.model_ref("gpt2-small").inputs[0].shape == (4, 128)


@pytest.mark.parametrize("kwargs,message", [
    ({"name": "resnet50", "seq_len": 5}, "takes images"),
    ({"name": "gpt2-small", "seq_len": 5000}, "takes 1 to 1024"),
    ({"name": "resnet50", "input_shapes": [(1, 3)]}, "for user models"),
    ({"name": "resnet50", "batch_size": 0}, "must be >= 1"),
    ({"name": "x.py:build"}, "--input-shape"),
    ({"name": "x.py:build", "input_shapes": [(2, 3)], "input_dtypes": ["complex"]}, "complex"),
    ({"name": "x.py:build", "input_shapes": [(2, 3)], "seq_len": 4}, "--seq-len"),
])
def test_model_ref_rejects_bad_options(kwargs, message):
    with pytest.raises(BadInput, match=message):
        zoo.model_ref(**kwargs)


USER_MODEL = """
import torch
from torch import nn

class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens, mask):
        return self.head(self.emb(tokens)) * mask.unsqueeze(-1)

def make():
    return Tagger()

def not_a_module():
    return 42
"""


def test_user_callable_from_a_file(tmp_path, monkeypatch):
    path = tmp_path / "tagger.py"
    path.write_text(USER_MODEL)
    monkeypatch.chdir(tmp_path)
    ref = zoo.model_ref("tagger.py:make", input_shapes=[(4, 7), (4, 7)],
                        input_dtypes=["int64", "float32"], batch_size=6)
    assert ref.source == "callable" and ref.name == f"{path.resolve()}:make"
    assert [s.shape for s in ref.inputs] == [(6, 7), (6, 7)]
    workload = zoo.instantiate(ref, seed=0)
    inputs, target = workload.make_batch(2, seed=0)
    assert target is None
    assert inputs[0].dtype == torch.int64 and int(inputs[0].max()) < 50  # below the embedding size
    loss = workload.loss(workload.module(*inputs), target)
    out = workload.module(*inputs)
    assert torch.allclose(loss, out.pow(2).mean())  # documented loss of user models
    with pytest.raises(BadInput, match="expected it to return a torch.nn.Module"):
        zoo.instantiate(zoo.model_ref(f"{path}:not_a_module", input_shapes=[(1, 1)]))
    with pytest.raises(BadInput, match="has no attribute"):
        zoo.instantiate(zoo.model_ref(f"{path}:missing", input_shapes=[(1, 1)]))


def test_user_callable_from_a_module_name():
    ref = zoo.model_ref("torch.nn:Identity", input_shapes=[(2, 5)])
    workload = zoo.instantiate(ref)
    assert isinstance(workload.module, torch.nn.Identity)
    with pytest.raises(BadInput, match="cannot be imported"):
        zoo.instantiate(zoo.model_ref("no_such_pkg_xyz.mod:fn", input_shapes=[(1,)]))
