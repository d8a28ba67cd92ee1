"""Artifacts: the typed files dl-nfv commands exchange, their validation and errors."""

from .devices import CATALOG, DeviceKind, DeviceType, lookup
from .errors import (
    ArtifactMismatch,
    BadInput,
    DlNfvError,
    InfeasiblePlan,
    InvalidArtifact,
    RuntimeFailure,
    SolverError,
    UnknownName,
)
from .io import KINDS, dumps, fingerprint, from_document, load, read_document, save
from .opgraph import Edge, Granularity, ModelRef, Op, OpGraph, OpKind, ProfileInfo, TensorSpec
from .plan import (
    Action,
    Collective,
    Compression,
    Fusion,
    Group,
    Optimizer,
    Pipeline,
    Plan,
    PlanStatus,
    Prediction,
    ScheduleKind,
    SyncMethod,
    TieSync,
    format_schedule,
    order_problem,
    parse_schedule,
    validate_against,
)
from .records import from_data, record, to_data
from .topology import Cluster, Device, Route, Topology, cluster_of

__all__ = [
    "CATALOG", "KINDS", "Action", "ArtifactMismatch", "BadInput", "Cluster", "Collective",
    "Compression", "Device", "DeviceKind", "DeviceType", "DlNfvError", "Edge", "Fusion",
    "Granularity", "Group", "InfeasiblePlan", "InvalidArtifact", "ModelRef", "Op", "OpGraph",
    "OpKind", "Optimizer", "Pipeline", "Plan", "PlanStatus", "Prediction", "ProfileInfo",
    "Route", "RuntimeFailure", "ScheduleKind", "SolverError", "SyncMethod", "TensorSpec", "TieSync",
    "Topology", "UnknownName", "cluster_of", "dumps", "fingerprint", "format_schedule",
    "from_data", "from_document", "load", "lookup", "order_problem", "parse_schedule", "read_document", "record",
    "save", "to_data", "validate_against",
]
