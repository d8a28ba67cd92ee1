"""The device catalog: peak figures of the accelerators (and CPUs) dl-nfv knows.

Figures are dense peaks from each vendor datasheet (named beside each entry);
tensor-core FP16/BF16 with FP32 accumulate where the part has tensor cores.
``bf16_tflops`` is ``None`` where the part has no BF16 support. Memory is in
GiB (2**30 bytes), memory bandwidth in GB/s (1e9 bytes/s).

A topology file may add types of its own (``device_types:``) or override a
figure per device; ``catalog_with`` merges those over this table.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import UnknownName
from .records import check, record

GIB = 2**30


class DeviceKind(StrEnum):
    GPU = "gpu"
    CPU = "cpu"


@record
class DeviceType:
    """One kind of compute device and its peak figures."""

    name: str
    kind: DeviceKind = DeviceKind.GPU
    memory_gib: float
    fp32_tflops: float
    fp16_tflops: float
    bf16_tflops: float | None = None
    memory_bandwidth_gb_per_s: float
    launch_overhead_us: float = 5.0
    # CPU cores one device of this type computes with (its worker's threads); a CPU type
    # without a figure has one, a GPU none
    cores: int | None = None
    datasheet: str = ""

    def __post_init__(self) -> None:
        check(bool(self.name), "device type name must not be empty")
        for name in ("memory_gib", "fp32_tflops", "fp16_tflops", "memory_bandwidth_gb_per_s"):
            value = getattr(self, name)
            check(value > 0, f"{name} must be > 0, got {value}")
        check(self.bf16_tflops is None or self.bf16_tflops > 0,
              f"bf16_tflops must be > 0 or absent, got {self.bf16_tflops}")
        check(self.launch_overhead_us >= 0, f"launch_overhead_us must be >= 0, got {self.launch_overhead_us}")
        check(self.cores is None or self.cores >= 1, f"cores must be >= 1, got {self.cores}")

    @property
    def cpu_cores(self) -> int | None:
        """The cores a CPU device of this type computes with (``cores``, else one); None for
        a GPU."""
        return (self.cores or 1) if self.kind is DeviceKind.CPU else None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_tflops(self, dtype: str = "float32") -> float:
        """Peak TFLOP/s for ``dtype`` (float32, float16, bfloat16); falls back to FP32."""
        if dtype in ("float16", "half"):
            return self.fp16_tflops
        if dtype in ("bfloat16",):
            return self.bf16_tflops or self.fp32_tflops
        return self.fp32_tflops


def _gpu(name, memory_gib, fp32, fp16, bf16, bandwidth, datasheet) -> DeviceType:
    return DeviceType(name=name, memory_gib=memory_gib, fp32_tflops=fp32, fp16_tflops=fp16,
                      bf16_tflops=bf16, memory_bandwidth_gb_per_s=bandwidth, datasheet=datasheet)


CATALOG: dict[str, DeviceType] = {t.name: t for t in (
    # NVIDIA Tesla P100 PCIe data sheet (2016): 9.3 FP32, 18.7 FP16, 732 GB/s, 16 GB HBM2
    _gpu("P100", 16, 9.3, 18.7, None, 732, "NVIDIA Tesla P100 PCIe datasheet"),
    # NVIDIA Tesla V100 SXM2 data sheet (2018): 15.7 FP32, 125 tensor, 900 GB/s
    _gpu("V100-16GB", 16, 15.7, 125, None, 900, "NVIDIA Tesla V100 SXM2 datasheet"),
    _gpu("V100-32GB", 32, 15.7, 125, None, 900, "NVIDIA Tesla V100 SXM2 datasheet"),
    # NVIDIA GeForce GTX 1080 Ti spec page: 11.3 FP32, FP16 at 1/64 rate, 484 GB/s, 11 GB
    _gpu("1080Ti", 11, 11.3, 0.177, None, 484, "NVIDIA GeForce GTX 1080 Ti specifications"),
    # NVIDIA T4 data sheet (2019): 8.1 FP32, 65 FP16 tensor, 320 GB/s, 16 GB
    _gpu("T4", 16, 8.1, 65, None, 320, "NVIDIA T4 Tensor Core GPU datasheet"),
    # NVIDIA A10 data sheet (2021): 31.2 FP32, 125 FP16/BF16 tensor, 600 GB/s, 24 GB
    _gpu("A10", 24, 31.2, 125, 125, 600, "NVIDIA A10 Tensor Core GPU datasheet"),
    # NVIDIA L4 data sheet (2023): 30.3 FP32, 121 FP16/BF16 tensor, 300 GB/s, 24 GB
    _gpu("L4", 24, 30.3, 121, 121, 300, "NVIDIA L4 Tensor Core GPU datasheet"),
    # NVIDIA A100 data sheet (2021): 19.5 FP32, 312 FP16/BF16 tensor; 1,555 / 2,039 GB/s
    _gpu("A100-40GB", 40, 19.5, 312, 312, 1555, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)"),
    _gpu("A100-80GB", 80, 19.5, 312, 312, 2039, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"),
    # NVIDIA H100 data sheet (SXM5): 67 FP32, 989 FP16/BF16 tensor (dense), 3.35 TB/s, 80 GB
    _gpu("H100", 80, 67, 989, 989, 3350, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    # NVIDIA H200 data sheet (SXM): 67 FP32, 989 FP16/BF16 tensor (dense), 4.8 TB/s, 141 GB
    _gpu("H200", 141, 67, 989, 989, 4800, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: 35.6 FP32, 71 FP16/BF16 tensor (FP32 acc.), 936 GB/s
    _gpu("RTX-3090", 24, 35.6, 71, 71, 936, "NVIDIA Ampere GA102 GPU architecture whitepaper"),
    # NVIDIA Ada Lovelace whitepaper, RTX 4090: 82.6 FP32, 165.2 FP16/BF16 tensor (FP32 acc.), 1,008 GB/s
    _gpu("RTX-4090", 24, 82.6, 165.2, 165.2, 1008, "NVIDIA Ada Lovelace GPU architecture whitepaper"),
    # A generic two-core x86-64 server slice: 2 cores x 3 GHz x 32 FP32 FLOP/cycle (AVX2 FMA),
    # ~20 GB/s of DRAM bandwidth. Override per topology (profile network writes measured figures).
    DeviceType(name="cpu", kind=DeviceKind.CPU, memory_gib=16, fp32_tflops=0.19, fp16_tflops=0.19,
               bf16_tflops=None, memory_bandwidth_gb_per_s=20, launch_overhead_us=2.0,
               datasheet="generic x86-64 (2 cores, AVX2 FMA); no vendor datasheet"),
)}


def lookup(name: str, extra: dict[str, DeviceType] | None = None) -> DeviceType:
    """The device type called ``name``, from ``extra`` first, then the built-in catalog.

    Raises ``UnknownName`` listing the known types.
    """
    if extra and name in extra:
        return extra[name]
    if name in CATALOG:
        return CATALOG[name]
    known = sorted({*CATALOG, *(extra or {})})
    raise UnknownName(f"unknown device type {name!r}; known: {', '.join(known)}")
