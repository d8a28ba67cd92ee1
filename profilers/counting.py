"""Counting what each op does at the ATen level: FLOPs, bytes accessed, activation
memory, and the peak of live tensor memory over a training step.

``CostCounter`` is a ``TorchDispatchMode``: every ATen call of the forward and
backward passes goes through it and is charged to the op named by its
``current`` attribute (the profiler sets it node by node in the forward pass,
and from autograd hooks in the backward pass).

* FLOPs: the formulas of ``torch.utils.flop_counter`` (matmul, conv, attention
  kernels, 2 FLOPs per multiply-add), with FlopCounterMode's rule of
  decomposing ops it has no formula for, plus formulas the registry lacks for
  kernels chosen on CPU: the fused CPU attention
  (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) and the
  fused LSTM/GRU layers (``mkldnn_rnn_layer``, ``_cudnn_rnn`` and backwards:
  2 FLOPs per weight element per input row, twice that backward); and a
  convolution backward that respects groups (each requested gradient costs one
  forward convolution; torch's formula overcounts depthwise convolutions).
* Bytes accessed (forward): for each non-view ATen call, the bytes of its
  tensor inputs plus its tensor outputs, i.e. one read of every operand and one
  write of every result. No cache reuse is modelled.
* Activation bytes: storages an op allocates in its forward pass that are
  still alive when the forward pass ends (saved for backward, or the output).
* Peak memory: the largest total of live tensor storages (parameters, inputs,
  activations, gradients, temporaries) seen during the step; it ignores
  allocator caching and fragmentation.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.utils.flop_counter as flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dl_nfv.artifacts import BadInput

aten = torch.ops.aten


class MemoryLimitExceeded(BadInput):
    """The live tensors of a step grew past the memory the machine has available."""

    def __init__(self, live_bytes: int, limit_bytes: int):
        self.live_bytes = live_bytes
        self.limit_bytes = limit_bytes
        super().__init__(f"live tensors reached {live_bytes / 2**30:.2f} GiB, more than the "
                         f"{limit_bytes / 2**30:.2f} GiB available")

_METADATA_OPS = frozenset({
    aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default,
    aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
    aten.storage_offset.default, aten.sym_storage_offset.default, aten.numel.default,
    aten.sym_numel.default, aten.dim.default, torch.ops.prim.layout.default,
})


def _rows(t: torch.Tensor) -> int:
    return t.numel() // max(1, t.shape[-1])


def _matrix_numel(weights: Iterable) -> int:
    return sum(w.numel() for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2)


def _sdpa_cpu(query, key, value, *args, out_val=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _sdpa_cpu_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def _mkldnn_rnn(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    return 2 * _rows(input) * _matrix_numel((w_ih, w_hh))


def _mkldnn_rnn_backward(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    return 4 * _rows(input) * _matrix_numel((w_ih, w_hh))


def _cudnn_rnn(input, weights, *args, out_val=None, **kwargs) -> int:
    return 2 * _rows(input) * _matrix_numel(weights)


def _cudnn_rnn_backward(input, weights, *args, out_val=None, **kwargs) -> int:
    return 4 * _rows(input) * _matrix_numel(weights)


def _conv_backward(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
                   output_padding, groups, output_mask, *args, out_val=None, **kwargs) -> int:
    # Each gradient (input, weight) costs as much as the forward convolution. torch's formula
    # transposes the weight shape and so counts grouped (depthwise) convolutions `groups` times.
    forward = flop_counter.conv_flop_count(list(x.shape), list(w.shape), list(grad_out.shape),
                                           transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _extra_formulas() -> dict:
    table = {}
    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", _sdpa_cpu),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_cpu_backward),
                     ("mkldnn_rnn_layer", _mkldnn_rnn),
                     ("mkldnn_rnn_layer_backward", _mkldnn_rnn_backward),
                     ("_cudnn_rnn", _cudnn_rnn),
                     ("_cudnn_rnn_backward", _cudnn_rnn_backward),
                     ("convolution_backward", _conv_backward)):
        packet = getattr(aten, name, None)
        if packet is not None:
            table[packet] = fn
    return table


def flop_formulas() -> dict:
    """torch's flop registry (OpOverloadPacket -> formula) plus the formulas above."""
    return {**flop_counter.flop_registry, **_extra_formulas()}


def tensor_bytes(value) -> int:
    """Bytes of every tensor in a (nested) value; 0 for non-tensors."""
    leaves, _ = tree_flatten(value)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class CostCounter(TorchDispatchMode):
    """Charges FLOPs, bytes and allocations of every ATen call to ``current``.

    Set ``current`` (an op id, or None for work outside the graph such as the
    loss) and ``phase`` (``"fwd"`` or ``"bwd"``) as execution moves on. Call
    ``track(tensors)`` before the step for memory that already exists
    (parameters, inputs), and ``end_forward()`` once the forward pass is done.
    With ``memory_limit_bytes``, an allocation that takes the live total past
    the limit raises ``MemoryLimitExceeded`` (before the operating system's
    out-of-memory killer would end the process without a word).
    """

    def __init__(self, memory_limit_bytes: int | None = None) -> None:
        super().__init__()
        self.memory_limit_bytes = memory_limit_bytes
        self.registry = flop_formulas()
        self.current: str | None = None
        self.phase = "fwd"
        self.flops: dict[str | None, float] = defaultdict(float)
        self.bwd_flops: dict[str | None, float] = defaultdict(float)
        self.bytes_accessed: dict[str | None, float] = defaultdict(float)
        self.activation_bytes: dict[str | None, int] = defaultdict(int)
        self.live_bytes = 0
        self.peak_bytes = 0
        # id(storage) -> (op, phase, nbytes) for storages seen alive
        self._storages: dict[int, tuple[str | None, str, int]] = {}

    # ------------------------------------------------------------------ memory
    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._track(t, owner=None, phase="pre")

    def _track(self, t: torch.Tensor, owner: str | None, phase: str) -> None:
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._storages:
            return
        nbytes = storage.nbytes()
        self._storages[key] = (owner, phase, nbytes)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._release, key).atexit = False
        if self.memory_limit_bytes is not None and self.live_bytes > self.memory_limit_bytes:
            raise MemoryLimitExceeded(self.live_bytes, self.memory_limit_bytes)

    def _release(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None:
            self.live_bytes -= entry[2]

    def end_forward(self) -> None:
        """Record, per op, the bytes it allocated in the forward pass that are still alive."""
        for owner, phase, nbytes in self._storages.values():
            if phase == "fwd":
                self.activation_bytes[owner] += nbytes

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_OPS:
            return func(*args, **kwargs)
        packet = func._overloadpacket
        if packet not in self.registry and func is not torch.ops.prim.device.default:
            with self:  # as FlopCounterMode: count the pieces of ops without a formula
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        formula = self.registry.get(packet)
        if formula is not None:
            flops = float(formula(*args, **kwargs, out_val=out))
            (self.flops if self.phase == "fwd" else self.bwd_flops)[self.current] += flops
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not func.is_view and self.phase == "fwd":
            self.bytes_accessed[self.current] += tensor_bytes((args, kwargs)) + tensor_bytes(outputs)
        for t in outputs:
            self._track(t, owner=self.current, phase=self.phase)
        return out
