"""``show`` of a ``policy``: the header a person checks before planning with it."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.policy import Policy


def render(policy: Policy) -> Group:
    """What the policy serves and came from, then its tensors (name, shape, values)."""
    header = Table(title=f"policy for `plan {policy.planner}`", title_justify="left",
                   show_header=False)
    header.add_column("field")
    header.add_column("value")
    arch = ", ".join(f"{k} {v}" for k, v in policy.architecture.items()) or "-"
    header.add_row("feature schema", str(policy.feature_schema_version))
    header.add_row("architecture", arch)
    header.add_row("parameters", f"{policy.parameter_count:,}")
    header.add_row("trained on graphs", ", ".join(policy.trained_on.graphs) or "-")
    header.add_row("trained on topologies", ", ".join(policy.trained_on.topologies) or "-")
    header.add_row("episodes", f"{policy.trained_on.episodes:,}")
    if policy.trained_on.max_devices:
        header.add_row("largest cluster", f"{policy.trained_on.max_devices} devices")
    header.add_row("seed", str(policy.seed))
    header.add_row("command", policy.command or "-")
    for note in policy.notes:
        header.add_row("note", note)
    tensors = Table(title="tensors", title_justify="left")
    tensors.add_column("name")
    tensors.add_column("shape", justify="right")
    tensors.add_column("values", justify="right")
    for w in policy.weights:
        tensors.add_row(w.name, " x ".join(map(str, w.shape)) or "scalar", f"{w.count:,}")
    return Group(header, tensors)
