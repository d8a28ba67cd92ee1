"""The model zoo, and how any model (zoo name or user callable) becomes a ``Workload``.

``ZOO`` maps a name to a ``ZooModel``: how to build it, its task (what inputs
and loss it takes), its default batch size / sequence length / granularity
(sizes that profile on a 2-core CPU), and its published parameter count. Every
name also exists as ``<name>-tiny``, the same architecture at a toy size for
tests; ``gpt2-tiny`` and ``bert-tiny`` are aliases of ``gpt2-small-tiny`` and
``bert-base-tiny``.

``model_ref(...)`` turns command-line choices into the ``ModelRef`` stored in
an op graph; ``instantiate(ref, seed=...)`` turns a ``ModelRef`` back into a
``Workload`` (module built deterministically from the seed, synthetic batches
of any size, the loss). The profiler and the training runtime both build
models only through ``instantiate``, so every rank builds the same model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import nn

from dl_nfv.artifacts import BadInput, Granularity, ModelRef, TensorSpec, UnknownName

from . import gnmt, text, vision

TINY = "-tiny"
ALIASES = {"gpt2-tiny": "gpt2-small-tiny", "bert-tiny": "bert-base-tiny"}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


class Task(StrEnum):
    """What a model consumes and how its loss is computed."""

    IMAGE = "image"  # (B, C, H, W) or (B, F) floats -> (B, classes); cross-entropy on labels
    LM = "lm"  # (B, S) tokens -> (B, S, vocab); cross-entropy on next tokens
    SEQ2SEQ = "seq2seq"  # (B, S) source, (B, S) target tokens -> (B, S, vocab)
    USER = "user"  # any inputs; loss = mean of squares of the output


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry. ``input_shape`` is the per-sample shape of image tasks."""

    name: str
    family: str
    task: Task
    build: Callable[[], nn.Module]
    description: str
    published_params: int | None
    classes: int = 1000
    vocab: int = 0
    input_shape: tuple[int, ...] = ()
    default_batch: int = 8
    default_seq_len: int = 0
    max_seq_len: int = 0
    default_granularity: Granularity = Granularity.OP
    params_note: str = ""

    @property
    def default_size(self) -> str:
        if self.task is Task.IMAGE:
            return f"batch {self.default_batch}, {'x'.join(map(str, self.input_shape))}"
        return f"batch {self.default_batch}, seq {self.default_seq_len}"


def _entries() -> list[ZooModel]:
    T, B, G = text.TransformerConfig, text.BertConfig, text.GPT2Config
    full = [
        ZooModel("mlp", "mlp", Task.IMAGE, lambda: vision.MLP(784, (2048, 2048, 2048), 10),
                 "3 hidden layers of 2048 ReLU units over 28x28 inputs, 10 classes",
                 10_020_874, classes=10, input_shape=(1, 28, 28), default_batch=64,
                 params_note="analytic (784*2048 + 2*2048^2 + 2048*10 + biases)"),
        ZooModel("vgg19", "vgg", Task.IMAGE, vision.VGG, "VGG-19 (configuration E), 224x224",
                 143_667_240, input_shape=(3, 224, 224), default_batch=4),
        ZooModel("resnet50", "resnet", Task.IMAGE, lambda: vision.ResNet((3, 4, 6, 3)),
                 "ResNet-50 v1.5 (bottleneck), 224x224", 25_557_032,
                 input_shape=(3, 224, 224), default_batch=8),
        ZooModel("resnet101", "resnet", Task.IMAGE, lambda: vision.ResNet((3, 4, 23, 3)),
                 "ResNet-101 v1.5, 224x224", 44_549_160, input_shape=(3, 224, 224), default_batch=4),
        ZooModel("resnet152", "resnet", Task.IMAGE, lambda: vision.ResNet((3, 8, 36, 3)),
                 "ResNet-152 v1.5, 224x224", 60_192_808, input_shape=(3, 224, 224), default_batch=4),
        ZooModel("inception-v3", "inception", Task.IMAGE, vision.InceptionV3,
                 "Inception-v3 without the auxiliary head, 299x299", 23_834_568,
                 input_shape=(3, 299, 299), default_batch=4),
        ZooModel("mobilenet-v2", "mobilenet", Task.IMAGE, vision.MobileNetV2,
                 "MobileNet-v2 (width 1.0), 224x224", 3_504_872, input_shape=(3, 224, 224),
                 default_batch=16),
        ZooModel("transformer", "transformer", Task.SEQ2SEQ, text.Transformer,
                 "Transformer base: 6+6 layers, d 512, 8 heads, shared 37k vocabulary",
                 63_082_496, vocab=T.vocab, default_batch=8, default_seq_len=64,
                 max_seq_len=T.max_len,
                 params_note="the paper rounds to 65M; shared, tied 37,000-token embedding"),
        ZooModel("bert-base", "bert", Task.LM, text.Bert,
                 "BERT-base with the masked-LM head: 12 layers, d 768, 12 heads",
                 109_514_298, vocab=B.vocab, default_batch=4, default_seq_len=128,
                 max_seq_len=B.max_positions, default_granularity=Granularity.OP),
        ZooModel("bert-large", "bert", Task.LM,
                 lambda: text.Bert(B(hidden=1024, layers=24, heads=16, intermediate=4096)),
                 "BERT-large with the masked-LM head: 24 layers, d 1024, 16 heads",
                 335_174_458, vocab=B.vocab, default_batch=2, default_seq_len=128,
                 max_seq_len=B.max_positions, default_granularity=Granularity.LAYER),
        ZooModel("gpt2-small", "gpt2", Task.LM, text.GPT2,
                 "GPT-2 small: 12 layers, d 768, 12 heads, tied 50,257-token head",
                 124_439_808, vocab=G.vocab, default_batch=4, default_seq_len=128,
                 max_seq_len=G.max_positions),
        ZooModel("gpt2-medium", "gpt2", Task.LM, lambda: text.GPT2(G(d_model=1024, layers=24, heads=16)),
                 "GPT-2 medium: 24 layers, d 1024, 16 heads", 354_823_168, vocab=G.vocab,
                 default_batch=2, default_seq_len=128, max_seq_len=G.max_positions,
                 default_granularity=Granularity.LAYER),
        ZooModel("gpt2-large", "gpt2", Task.LM, lambda: text.GPT2(G(d_model=1280, layers=36, heads=20)),
                 "GPT-2 large: 36 layers, d 1280, 20 heads", 774_030_080, vocab=G.vocab,
                 default_batch=1, default_seq_len=128, max_seq_len=G.max_positions,
                 default_granularity=Granularity.LAYER),
        ZooModel("gpt2-xl", "gpt2", Task.LM, lambda: text.GPT2(G(d_model=1600, layers=48, heads=25)),
                 "GPT-2 XL: 48 layers, d 1600, 25 heads", 1_557_611_200, vocab=G.vocab,
                 default_batch=1, default_seq_len=64, max_seq_len=G.max_positions,
                 default_granularity=Granularity.LAYER),
        ZooModel("gnmt", "gnmt", Task.SEQ2SEQ, gnmt.GNMT,
                 "GNMT-v2: 4+4 LSTM layers of 1024, attention, shared 32,320-token vocabulary",
                 160_671_297, vocab=gnmt.GNMTConfig.vocab, default_batch=8, default_seq_len=32,
                 max_seq_len=10_000),
    ]
    tiny_builders = {
        "mlp": lambda: vision.MLP(64, (32, 32), 10),
        "vgg19": lambda: vision.VGG(num_classes=10, hidden=32, pool=1, width_div=16),
        "resnet50": lambda: vision.ResNet((1, 1, 1, 1), num_classes=10, width=4),
        "resnet101": lambda: vision.ResNet((1, 1, 2, 1), num_classes=10, width=4),
        "resnet152": lambda: vision.ResNet((1, 2, 2, 1), num_classes=10, width=4),
        "inception-v3": lambda: vision.InceptionV3(num_classes=10, width_div=16),
        "mobilenet-v2": lambda: vision.MobileNetV2(num_classes=10, width_mult=0.25),
        "transformer": lambda: text.Transformer(T(vocab=96, d_model=32, heads=2, d_ff=64,
                                                  encoder_layers=2, decoder_layers=2, max_len=64)),
        "bert-base": lambda: text.Bert(B(vocab=96, hidden=32, layers=2, heads=2, intermediate=64,
                                         max_positions=64)),
        "bert-large": lambda: text.Bert(B(vocab=96, hidden=32, layers=3, heads=2, intermediate=64,
                                          max_positions=64)),
        "gpt2-small": lambda: text.GPT2(G(vocab=96, d_model=32, layers=2, heads=2, max_positions=64)),
        "gpt2-medium": lambda: text.GPT2(G(vocab=96, d_model=32, layers=3, heads=2, max_positions=64)),
        "gpt2-large": lambda: text.GPT2(G(vocab=96, d_model=48, layers=3, heads=3, max_positions=64)),
        "gpt2-xl": lambda: text.GPT2(G(vocab=96, d_model=48, layers=4, heads=3, max_positions=64)),
        "gnmt": lambda: gnmt.GNMT(gnmt.GNMTConfig(vocab=96, hidden=16)),
    }
    tiny_inputs = {"mlp": (1, 8, 8), "vgg19": (3, 32, 32), "resnet50": (3, 32, 32),
                   "resnet101": (3, 32, 32), "resnet152": (3, 32, 32), "inception-v3": (3, 75, 75),
                   "mobilenet-v2": (3, 32, 32)}
    out = list(full)
    for m in full:
        out.append(ZooModel(
            m.name + TINY, m.family, m.task, tiny_builders[m.name],
            f"{m.description.split(':')[0]} at a toy size", None,
            classes=10 if m.task is Task.IMAGE else m.classes,
            vocab=96 if m.vocab else 0, input_shape=tiny_inputs.get(m.name, ()),
            default_batch=4, default_seq_len=8 if m.default_seq_len else 0,
            max_seq_len=64 if m.max_seq_len else 0, params_note="toy size, not a published model"))
    return out


ZOO: dict[str, ZooModel] = {m.name: m for m in _entries()}


def lookup(name: str) -> ZooModel:
    """The zoo entry called ``name`` (or an alias); ``UnknownName`` listing the zoo otherwise."""
    key = ALIASES.get(name, name)
    if key in ZOO:
        return ZOO[key]
    full = [n for n in ZOO if not n.endswith(TINY)]
    raise UnknownName(f"unknown model {name!r}: not in the zoo ({', '.join(full)}; each also "
                      f"as <name>-tiny) and not a module:callable or file.py:callable")


def is_callable_name(name: str) -> bool:
    """True for ``pkg.mod:fn`` and ``path/file.py:fn`` references."""
    return ":" in name


def model_ref(name: str, *, batch_size: int | None = None, seq_len: int | None = None,
              input_shapes: Sequence[Sequence[int]] = (), input_dtypes: Sequence[str] = (),
              dtype: str = "float32") -> ModelRef:
    """The ``ModelRef`` for a zoo name or a user callable, with the options given.

    Zoo models take ``batch_size`` and (sequence models) ``seq_len``, with the
    entry's defaults. User callables take one ``input_shapes`` entry per
    positional input (dimension 0 is the batch; ``batch_size`` replaces it) and
    optionally one dtype per input (or one for all). A file path is made
    absolute so the reference works from any directory.
    """
    if dtype not in FLOAT_DTYPES:
        raise BadInput(f"--dtype {dtype!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    if batch_size is not None and batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, got {batch_size}")
    if is_callable_name(name):
        from .user import normalise_name

        return _user_ref(normalise_name(name), batch_size, seq_len, input_shapes, input_dtypes, dtype)
    entry = lookup(name)
    if input_shapes or input_dtypes:
        raise BadInput(f"--input-shape/--input-dtype are for user models; zoo model {entry.name!r} "
                       f"takes --batch-size{' and --seq-len' if entry.default_seq_len else ''}")
    batch = batch_size or entry.default_batch
    options: dict = {}
    if entry.task is Task.IMAGE:
        if seq_len is not None:
            raise BadInput(f"--seq-len: model {entry.name!r} takes images, not sequences")
        inputs = (TensorSpec(shape=(batch, *entry.input_shape), dtype=dtype),)
    else:
        seq = seq_len or entry.default_seq_len
        if seq < 1 or seq > entry.max_seq_len:
            raise BadInput(f"--seq-len {seq}: model {entry.name!r} takes 1 to {entry.max_seq_len}")
        options["seq_len"] = seq
        n_inputs = 2 if entry.task is Task.SEQ2SEQ else 1
        inputs = tuple(TensorSpec(shape=(batch, seq), dtype="int64") for _ in range(n_inputs))
    return ModelRef(name=entry.name, source="zoo", batch_size=batch, dtype=dtype, inputs=inputs,
                    options=options)


def _user_ref(name, batch_size, seq_len, input_shapes, input_dtypes, dtype) -> ModelRef:
    if seq_len is not None:
        raise BadInput("--seq-len is for zoo sequence models; give a user model its shapes "
                       "with --input-shape")
    if not input_shapes:
        raise BadInput(f"model {name!r} is a user callable: give its input shape(s) with "
                       f"--input-shape, e.g. --input-shape 8,3,224,224")
    if input_dtypes and len(input_dtypes) not in (1, len(input_shapes)):
        raise BadInput(f"{len(input_dtypes)} --input-dtype values for {len(input_shapes)} "
                       f"--input-shape values; give one, or one per input")
    dtypes = list(input_dtypes) if len(input_dtypes) > 1 else list(input_dtypes) * len(input_shapes)
    dtypes = dtypes or [dtype] * len(input_shapes)
    specs = []
    for shape, dt in zip(input_shapes, dtypes):
        if dt not in DTYPES:
            raise BadInput(f"--input-dtype {dt!r}: expected one of {', '.join(DTYPES)}")
        shape = tuple(int(s) for s in shape)
        if not shape or any(s < 1 for s in shape):
            raise BadInput(f"--input-shape {','.join(map(str, shape))}: dimensions must be >= 1")
        if batch_size is not None:
            shape = (batch_size, *shape[1:])
        specs.append(TensorSpec(shape=shape, dtype=dt))
    return ModelRef(name=name, source="callable", batch_size=specs[0].shape[0], dtype=dtype,
                    inputs=tuple(specs))


@dataclass
class Workload:
    """A model ready to run: module, synthetic batches and loss.

    ``module`` is built deterministically from the seed (same ref and seed,
    same parameters). ``make_batch(batch_size, seed)`` returns the inputs (the
    profiled shapes with dimension 0 set to ``batch_size``) and the target
    (class labels or next tokens; ``None`` for user models). ``loss(output,
    target)`` is cross-entropy for zoo models and the mean of squares of the
    output (summed over the output's tensors) for user models, whose real loss
    is unknown.
    """

    ref: ModelRef
    module: nn.Module
    task: Task
    input_specs: tuple[TensorSpec, ...]
    classes: int = 0
    vocab: int = 0
    int_high: dict[int, int] = field(default_factory=dict)

    def make_batch(self, batch_size: int, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        if batch_size < 1:
            raise BadInput(f"batch size must be >= 1, got {batch_size}")
        gen = torch.Generator().manual_seed(seed)
        inputs = []
        for i, spec in enumerate(self.input_specs):
            shape = (batch_size, *spec.shape[1:])
            dt = DTYPES[spec.dtype]
            if dt.is_floating_point:
                inputs.append(torch.randn(shape, generator=gen).to(dt))
            elif dt is torch.bool:
                inputs.append(torch.randint(0, 2, shape, generator=gen).bool())
            else:
                high = self.int_high.get(i, self.vocab or 2)
                inputs.append(torch.randint(0, high, shape, generator=gen, dtype=dt))
        if self.task is Task.IMAGE:
            target = torch.randint(0, self.classes, (batch_size,), generator=gen)
        elif self.task in (Task.LM, Task.SEQ2SEQ):
            target = torch.randint(0, self.vocab, (batch_size, self.input_specs[-1].shape[1]),
                                   generator=gen)
        else:
            target = None
        return tuple(inputs), target

    def loss(self, output, target: torch.Tensor | None) -> torch.Tensor:
        if self.task is Task.IMAGE:
            return F.cross_entropy(output.float(), target)
        if self.task in (Task.LM, Task.SEQ2SEQ):
            return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())
        return mean_square(output)


def mean_square(output) -> torch.Tensor:
    """Sum over the output's floating-point tensors of their mean square."""
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(output)[0]
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise BadInput("the model's output has no floating-point tensor to take a loss of")
    return sum(t.float().pow(2).mean() for t in tensors)


def instantiate(model: ModelRef, *, seed: int = 0) -> Workload:
    """Build the ``Workload`` of ``model`` (zoo entry or user callable), deterministically.

    The module's parameters are drawn with ``torch.manual_seed(seed)`` inside a
    forked RNG (the caller's RNG state is left alone) and cast to
    ``model.dtype``. Raises ``UnknownName`` for an unknown zoo name and
    ``BadInput`` for a callable that cannot be loaded, raises, or does not
    return an ``nn.Module``.
    """
    dtype = DTYPES.get(model.dtype)
    if dtype is None or not dtype.is_floating_point:
        raise BadInput(f"model dtype {model.dtype!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    if model.source == "callable":
        from .user import build_user_module

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = build_user_module(model.name)
        module = module.to(dtype)
        return Workload(ref=model, module=module, task=Task.USER, input_specs=model.inputs,
                        int_high=_embedding_bounds(module, model.inputs))
    if model.source != "zoo":
        raise BadInput(f"model {model.name!r} came from a {model.source!r} import; only zoo models "
                       f"and callables can be built")
    entry = lookup(model.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = entry.build()
    module = module.to(dtype)
    return Workload(ref=model, module=module, task=entry.task, input_specs=model.inputs,
                    classes=entry.classes, vocab=entry.vocab)


def _embedding_bounds(module: nn.Module, specs: Sequence[TensorSpec]) -> dict[int, int]:
    """Integer inputs of user models are drawn below the smallest embedding table (else 2)."""
    sizes = [m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding)]
    high = min(sizes) if sizes else 2
    return {i: high for i, s in enumerate(specs) if not DTYPES[s.dtype].is_floating_point
            and DTYPES[s.dtype] is not torch.bool}


@functools.cache
def parameter_count(name: str) -> int:
    """Parameters of zoo model ``name``, counted on the meta device (no memory used)."""
    entry = lookup(name)
    with torch.device("meta"):
        return sum(p.numel() for p in entry.build().parameters())
