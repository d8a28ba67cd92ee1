"""The device catalog (re-exported from ``dl_nfv.artifacts.devices``), and naming CUDA devices.

``catalog_name_of_cuda(device)`` maps what CUDA reports (``NVIDIA H100 80GB HBM3``,
``Tesla V100-SXM2-32GB``) to a catalog type name, so that a profile made on a GPU
records its times under that type.
"""

from __future__ import annotations

import re

import torch

from dl_nfv.artifacts import BadInput
from dl_nfv.artifacts.devices import CATALOG, GIB, DeviceKind, DeviceType, lookup

__all__ = ["CATALOG", "DeviceKind", "DeviceType", "catalog_name_of_cuda", "catalog_name_of_gpu",
           "lookup"]

# (words the CUDA name must contain, catalog name by memory in GiB); first match wins.
_GPU_NAMES = (
    (("H200",), lambda gib: "H200"),
    (("H100",), lambda gib: "H100"),
    (("A100",), lambda gib: "A100-80GB" if gib > 48 else "A100-40GB"),
    (("V100",), lambda gib: "V100-32GB" if gib > 20 else "V100-16GB"),
    (("P100",), lambda gib: "P100"),
    (("T4",), lambda gib: "T4"),
    (("A10",), lambda gib: "A10"),
    (("L4",), lambda gib: "L4"),
    (("1080", "TI"), lambda gib: "1080Ti"),
    (("3090",), lambda gib: "RTX-3090"),
    (("4090",), lambda gib: "RTX-4090"),
)


def catalog_name_of_gpu(cuda_name: str, memory_bytes: int) -> str | None:
    """The catalog type of a GPU from its CUDA name and memory, or None if unknown."""
    words = set(re.split(r"[\s\-_]+", cuda_name.upper()))
    for required, choose in _GPU_NAMES:
        if all(w in words for w in required):
            return choose(memory_bytes / GIB)
    return None


def catalog_name_of_cuda(device: torch.device) -> str:
    """The catalog type of a CUDA device; ``BadInput`` asking for --device-type if unknown."""
    props = torch.cuda.get_device_properties(device)
    name = catalog_name_of_gpu(props.name, props.total_memory)
    if name is None:
        raise BadInput(f"GPU {props.name!r} is not in the device catalog; name its type with "
                       f"--device-type (one of {', '.join(CATALOG)})")
    return name
