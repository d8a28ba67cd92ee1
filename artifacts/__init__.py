"""Artifacts: the typed files dl-nfv commands exchange, their validation and errors.

The names below are imported from their modules on first use (PEP 562), so a command
that reads only some kinds of artifact (``nfv run``: an nf-config, an nfv-report) does not
load the others' modules.
"""

from importlib import import_module

_EXPORTS = {
    "devices": ("CATALOG", "DeviceKind", "DeviceType", "lookup"),
    "errors": ("ArtifactMismatch", "BadInput", "DlNfvError", "InfeasiblePlan", "InvalidArtifact",
               "RuntimeFailure", "SolverError", "UnknownName"),
    "io": ("KINDS", "dumps", "fingerprint", "from_document", "load", "read_document", "save"),
    "opgraph": ("Edge", "Granularity", "ModelRef", "Op", "OpGraph", "OpKind", "ProfileInfo",
                "TensorSpec"),
    "plan": ("Action", "Collective", "Compression", "Fusion", "Group", "Optimizer", "Pipeline",
             "Plan", "PlanStatus", "Prediction", "ScheduleKind", "SyncMethod", "TieSync",
             "format_schedule", "order_problem", "parse_schedule", "validate_against"),
    "records": ("from_data", "record", "to_data"),
    "topology": ("Cluster", "Device", "Route", "Topology", "cluster_of"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
