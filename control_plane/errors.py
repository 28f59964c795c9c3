"""The control plane's domain errors. Each docstring is the default message.

    AmcError
    ├── InvalidArgument          malformed input; names the field
    ├── NotFound
    │   ├── TaskNotFound
    │   ├── ArtifactNotFound
    │   ├── LibraryItemNotFound  no such app or file in the library
    │   ├── SnapshotNotFound     no host's emulators have that snapshot
    │   ├── HostNotFound
    │   ├── DeviceNotFound
    │   └── FairnessKeyNotFound
    ├── FailedPrecondition       the task's state does not allow it
    │   ├── HostInUse
    │   ├── HostNotRegistered    an Acquire from a host the control plane forgot
    │   ├── TaskAlreadyTerminal
    │   ├── NoCancellationRequested
    │   ├── DifferentReportRecorded
    │   ├── LeaseNotCurrent      an upload under a lease that ended or was replaced
    │   └── DifferentArtifactStored
    ├── Aborted                  lease / attempt fencing
    │   ├── LeaseConflict
    │   ├── StaleAttempt
    │   └── TaskMoved            a task's screen watch whose attempt is no longer current
    ├── Unauthenticated
    ├── PermissionDenied
    │   └── NotLeaseHolder       an upload under another host's lease
    ├── Unavailable
    │   ├── DatabaseUnavailable
    │   ├── Contended            lost to concurrent changes of the same rows, retries spent
    │   └── UploadsBusy          this replica holds its upload memory budget already
    ├── ResourceExhausted
    │   ├── ArtifactTooLarge
    │   ├── TooManyViewers       a token watching its limit of screens on this replica
    │   ├── SessionLimit         the token has as many sessions open as it may
    │   └── TooLargeForLibrary   an upload past --max-app-size
    └── DataLoss
        └── ChecksumMismatch     the bytes received are not the ones announced

The gRPC layer maps each branch to one status code (control_plane.rpc); nothing else
chooses codes.
"""

from __future__ import annotations


class AmcError(Exception):
    """The request failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidArgument(AmcError):
    """A field of the request is malformed."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(AmcError):
    """Not found."""


class TaskNotFound(NotFound):
    """No such task."""


class HostNotFound(NotFound):
    """No such host."""


class DeviceNotFound(NotFound):
    """No such device."""


class FairnessKeyNotFound(NotFound):
    """No such fairness key: no share set, and no task queued or running."""


class FailedPrecondition(AmcError):
    """The task's current state does not allow this."""


class HostInUse(FailedPrecondition):
    """The host is connected or holds leases, so it cannot be removed."""


class DeviceNotQuarantined(FailedPrecondition):
    """The device is not quarantined, or its host is not connected to release it."""


class HostNotRegistered(FailedPrecondition):
    """This host is not registered (it was forgotten or removed); register it again."""


class TaskAlreadyTerminal(FailedPrecondition):
    """The task already finished."""


class NoCancellationRequested(FailedPrecondition):
    """A cancelled outcome needs a cancellation request, and this attempt has none."""


class DifferentReportRecorded(FailedPrecondition):
    """This attempt already has a different result recorded."""


class Aborted(AmcError):
    """The lease or attempt is no longer current."""


class LeaseConflict(Aborted):
    """The lease does not belong to this host, task and attempt."""


class StaleAttempt(Aborted):
    """The lease expired or a newer attempt replaced it; the report was not recorded."""


class TaskMoved(Aborted):
    """The attempt a task's screen watch showed is no longer the task's current one: the
    task moved to another phone, or waits for one. Watch it again."""


class Unauthenticated(AmcError):
    """Missing or invalid bearer token."""

    def __init__(self, message: str | None = None, reason: str = "unknown") -> None:
        super().__init__(message)
        # missing | malformed | unknown | revoked: what the metrics count it as.
        self.reason = reason


class PermissionDenied(AmcError):
    """This token's role may not call this method."""


class Unavailable(AmcError):
    """Temporarily unavailable; retry."""


class Contended(Unavailable):
    """The change kept losing to concurrent changes of the same rows; nothing was changed.
    Retry.

    UNAVAILABLE, not ABORTED: a host agent takes ABORTED on a report as the final refusal
    of a stale lease, and would drop a result that only lost a race; UNAVAILABLE it retries.
    """


class DatabaseUnavailable(Unavailable):
    """The database is unreachable; retry."""


class ArtifactNotFound(NotFound):
    """No such artifact."""


class LibraryItemNotFound(NotFound):
    """The app library has no such app or file."""


class SnapshotNotFound(NotFound):
    """No emulator of the farm has that snapshot."""


class LeaseNotCurrent(FailedPrecondition):
    """The lease ended or a newer attempt replaced it; nothing was stored."""


class DifferentArtifactStored(FailedPrecondition):
    """This step already has a different artifact stored; it stands."""


class NotLeaseHolder(PermissionDenied):
    """The lease belongs to another host; nothing was stored."""


class ResourceExhausted(AmcError):
    """Over a limit."""


class ArtifactTooLarge(ResourceExhausted):
    """The artifact is larger than this control plane keeps; nothing was stored."""


class TooManyViewers(ResourceExhausted):
    """This token watches as many screens on this replica as it may; close one first."""


class SessionLimit(ResourceExhausted):
    """This token has as many sessions queued or running as it may; nothing was opened."""


class TooLargeForLibrary(ResourceExhausted):
    """The upload is larger than this control plane's app library keeps; nothing was kept."""


class DataLoss(AmcError):
    """The data arrived damaged."""


class ChecksumMismatch(DataLoss):
    """The bytes received do not match the size or sha256 announced; nothing was stored."""


class UploadsBusy(Unavailable):
    """This replica is receiving as many artifact bytes as it may hold; retry shortly."""
