"""Trained weights in and out of the ``policy`` artifact (``artifacts/policy.py``).

``policy_of`` packs a module's ``state_dict`` (float32, little-endian, base64) with
its header; ``load_weights`` unpacks a policy into a module of the same architecture,
refusing a policy for another planner, another feature schema or another shape,
with one line naming what differs. ``read_policy`` loads a file and refuses a file
that is not a policy. Round trip: a module saved and loaded into a fresh module of the
same architecture computes bit-identical outputs.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dl_nfv.artifacts import BadInput, InvalidArtifact, load
from dl_nfv.artifacts.policy import Policy, TrainedOn, Weight

from .features import FEATURE_SCHEMA_VERSION


def policy_of(module: nn.Module, *, planner: str, architecture: Mapping[str, Any],
              trained_on: TrainedOn, seed: int, command: str, notes: tuple[str, ...] = ()) -> Policy:
    """The ``policy`` artifact of ``module``'s current weights, at this feature schema."""
    weights = []
    for name, tensor in module.state_dict().items():
        values = tensor.detach().to(torch.float32).contiguous().numpy().astype("<f4")
        weights.append(Weight(name=name, shape=tuple(int(n) for n in tensor.shape),
                              data=base64.b64encode(values.tobytes()).decode("ascii")))
    return Policy(planner=planner, feature_schema_version=FEATURE_SCHEMA_VERSION,
                  architecture=dict(architecture), trained_on=trained_on, seed=seed,
                  command=command, weights=tuple(weights), notes=notes)


def load_weights(policy: Policy, module: nn.Module, *, planner: str) -> None:
    """Copy ``policy``'s weights into ``module``.

    Raises
    ------
    BadInput
        The policy serves another planner, was trained on another feature schema, or
        its tensors do not match the module's names and shapes (the first one named).
    """
    if policy.planner != planner:
        raise BadInput(f"the policy is for planner {policy.planner!r}, not {planner!r}")
    if policy.feature_schema_version != FEATURE_SCHEMA_VERSION:
        raise BadInput(f"the policy was trained on feature schema {policy.feature_schema_version}; "
                       f"this dl-nfv computes schema {FEATURE_SCHEMA_VERSION}: retrain it")
    own = module.state_dict()
    given = {w.name: w for w in policy.weights}
    missing = next((name for name in own if name not in given), None)
    if missing is not None:
        raise BadInput(f"the policy has no tensor {missing!r}: another architecture than "
                       f"{dict(policy.architecture)}?")
    extra = next((name for name in given if name not in own), None)
    if extra is not None:
        raise BadInput(f"the policy's tensor {extra!r} is not in this network")
    state = {}
    for name, tensor in own.items():
        w = given[name]
        if tuple(tensor.shape) != w.shape:
            raise BadInput(f"the policy's tensor {name!r} has shape {list(w.shape)}, the network's "
                           f"{list(tensor.shape)}")
        values = np.frombuffer(base64.b64decode(w.data), dtype="<f4").reshape(w.shape)
        state[name] = torch.from_numpy(values.astype(np.float32)).to(tensor.dtype)
    module.load_state_dict(state)


def build_network(policy: Policy, factory, architecture: dict, *, planner: str) -> nn.Module:
    """``factory(**architecture)`` with ``policy``'s architecture over the defaults and its
    weights loaded (``load_weights``), in eval mode.

    Raises
    ------
    BadInput
        The policy's architecture names a parameter ``architecture`` does not have, or what
        ``load_weights`` refuses.
    """
    unknown = sorted(set(policy.architecture) - set(architecture))
    if unknown:
        raise BadInput(f"the policy's architecture names {unknown[0]!r}, which this network "
                       f"does not have (it has {', '.join(architecture)})")
    network = factory(**{**architecture, **policy.architecture})
    load_weights(policy, network, planner=planner)
    network.eval()
    return network


def read_policy(path: str | Path) -> Policy:
    """Load a policy file; ``BadInput`` naming the file when it holds another kind."""
    try:
        return load(path, expect="policy")
    except InvalidArtifact as exc:
        if exc.field == "kind":
            raise BadInput(f"{path}: not a policy ({exc})") from None
        raise
