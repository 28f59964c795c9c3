"""Values the control plane passes around, one module per aggregate (as the store's):
`tasks`, `leases`, `hosts`, `queue`, `tokens`, `artifacts`. Import them from here. The spec
and result are kept as the bytes the gRPC edge gave us (serialized amc.v1 messages): the
store never needs their insides."""

from __future__ import annotations

from control_plane.domain.artifacts import ArtifactFile, ArtifactId, ArtifactInfo, NewArtifact
from control_plane.domain.hosts import DeviceHealth, DeviceInfo, HostEvent, HostInfo
from control_plane.domain.leases import (
    Acquired,
    Assignment,
    CancelNotice,
    DrainNotice,
    Expiry,
    Notice,
    Recorded,
    ReleaseNotice,
    Renewal,
    Report,
    ScreenNotice,
    StepProgress,
)
from control_plane.domain.queue import (
    DeviceMatch,
    FairShare,
    FairShareEvent,
    FarmGauges,
    KeyCap,
    KeyLoad,
    QueueGroup,
    QueueWait,
    ShareChange,
    TaskRead,
)
from control_plane.domain.tasks import (
    AttemptInfo,
    LeaseId,
    NewTask,
    Progress,
    Removed,
    SessionLease,
    SessionRelay,
    Task,
    TaskEvent,
    TaskHistory,
    TaskId,
)
from control_plane.domain.tokens import ANONYMOUS, Act, Principal, Role, TokenInfo

__all__ = [
    "ANONYMOUS",
    "Acquired",
    "Act",
    "ArtifactFile",
    "ArtifactId",
    "ArtifactInfo",
    "Assignment",
    "AttemptInfo",
    "CancelNotice",
    "DeviceHealth",
    "DeviceInfo",
    "DeviceMatch",
    "DrainNotice",
    "Expiry",
    "FairShare",
    "FairShareEvent",
    "FarmGauges",
    "HostEvent",
    "HostInfo",
    "KeyCap",
    "KeyLoad",
    "LeaseId",
    "NewArtifact",
    "NewTask",
    "Notice",
    "Principal",
    "Progress",
    "QueueGroup",
    "QueueWait",
    "Recorded",
    "ReleaseNotice",
    "Removed",
    "Renewal",
    "Report",
    "Role",
    "ScreenNotice",
    "SessionLease",
    "SessionRelay",
    "ShareChange",
    "StepProgress",
    "Task",
    "TaskEvent",
    "TaskHistory",
    "TaskId",
    "TaskRead",
    "TokenInfo",
]
