"""What amc_client raises.

    AmcClientError
    ├── FarmUnreachable         nothing answers at the farm's address, and nothing ever did
    ├── SessionRefused          the session never got its phone (refused, or its task ended first)
    │   └── NoPhone             no phone took it within its queue timeout (why: the last reason)
    ├── SessionEnded            the session is over; `reason` says why in one line
    │   ├── SessionCancelled    cancelled (`amc cancel`, the console): the cancel's reason
    │   ├── SessionIdle         no action for its idle timeout
    │   ├── SessionLeaseLost    its phone's lease was lost (the host or the phone gone)
    │   └── SessionDeadline     past its longest duration (max_duration)
    ├── ActionRefused           an action refused before it reached the phone (a bad argument,
    │                           checked here or by the control plane): nothing ran, the
    │                           session goes on
    └── ActionFailed            an action failed on the phone; the session goes on

gRPC errors that are not transient (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED…) of
calls other than a session's actions propagate as `grpc.aio.AioRpcError`, unchanged.
"""

from __future__ import annotations

import grpc

from amc.v1 import task_pb2


class AmcClientError(Exception):
    """Something amc_client could not do."""


class FarmUnreachable(AmcClientError):
    """No connection could be made to an address that has never answered this Farm (a
    wrong address or port, a control plane not started): raised at the first try, not
    after the retry budget. One that answered before is tried again as any transient
    error is (a replica restarting)."""

    def __init__(self, address: str, why: str) -> None:
        hint = ": is it running, and is the address right?" if why == "connection refused" else ""
        super().__init__(f"cannot reach the control plane at {address}: {why}{hint}")
        self.address, self.why = address, why


class SessionRefused(AmcClientError):
    """The session never got its phone."""

    def __init__(self, message: str, task: task_pb2.Task | None = None) -> None:
        super().__init__(message)
        self.task = task


class NoPhone(SessionRefused):
    """No phone took the session within its queue timeout; `pending_reason` is the last
    reason the control plane gave for the wait ("no registered device matches model=X",
    "1 matching device, busy"). The session's task was withdrawn."""

    def __init__(self, waited: float, task: task_pb2.Task | None, pending_reason: str) -> None:
        why = f": {pending_reason}" if pending_reason else ""
        super().__init__(f"no phone took the session within {waited:g} s{why}", task)
        self.pending_reason = pending_reason


class SessionEnded(AmcClientError):
    """The session is over; `task` is its finished task (status and result) when it could
    be read, `reason` the one line that says why."""

    def __init__(self, task: task_pb2.Task | None, reason: str = "") -> None:
        self.task = task
        self.reason = " ".join((reason or _reason(task)).split())  # one line, always
        super().__init__(f"session ended: {self.reason}")


class SessionCancelled(SessionEnded):
    """The session was cancelled (CancelTask: `amc cancel`, the console)."""


class SessionIdle(SessionEnded):
    """No action came for the session's idle timeout: the control plane ended it."""


class SessionLeaseLost(SessionEnded):
    """The session's lease on its phone was lost: it expired (its host went away), its
    host gave it back, or the phone was lost or quarantined (it stopped answering)."""


class SessionDeadline(SessionEnded):
    """The session ran past its longest duration (`max_duration`)."""


class ActionRefused(AmcClientError):
    """An action refused before it reached the phone: a bad argument (checked by the
    client library with the shared action table, or by the control plane), or a refusal
    of the session's (FAILED_PRECONDITION, RESOURCE_EXHAUSTED). Nothing ran, no step was
    recorded, and the session goes on. `code` is the gRPC status the refusal carries."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ActionFailed(AmcClientError):
    """One action failed on the phone (a selector not found, a shell error…)."""

    def __init__(self, step: task_pb2.StepResult) -> None:
        super().__init__(f"{step.name} failed: {step.error}")
        self.step = step


def _reason(task: task_pb2.Task | None) -> str:
    if task is None or task.status == task_pb2.TASK_STATUS_UNSPECIFIED:
        return "the session's call ended without saying how"
    status: str = task_pb2.TaskStatus.Name(task.status).removeprefix("TASK_STATUS_").lower()
    if task.status == task_pb2.TASK_STATUS_CANCELLED:
        why = task.cancel_reason or task.result.error
        return "cancelled" + (f": {why}" if why else "")
    if task.status == task_pb2.TASK_STATUS_DONE:
        return "done (closed)"
    return status + (f": {task.result.error}" if task.result.error else "")


# How the control plane records a failed session's end (Task.result.error), by the exception
# that says it: "lease lost: it expired", "lease lost: released by its host (host: …)",
# "device lost: …", "device quarantined: …", "deadline exceeded…", "idle timeout". Any other
# ("session relay lost: …", "session abandoned") is a SessionEnded saying the error.
_FAILED_BY_PREFIX: tuple[tuple[tuple[str, ...], type[SessionEnded]], ...] = (
    (("lease lost", "device lost", "device quarantined"), SessionLeaseLost),
    (("deadline exceeded",), SessionDeadline),
    (("idle timeout",), SessionIdle),
)


def session_ended(task: task_pb2.Task | None) -> SessionEnded:
    """The exception that says how the session of `task` (its finished task, as the
    control plane recorded it) ended: by its status and its error."""
    if task is None:
        return SessionEnded(None)
    if task.status == task_pb2.TASK_STATUS_CANCELLED:
        return SessionCancelled(task)
    if task.status != task_pb2.TASK_STATUS_FAILED:
        return SessionEnded(task)
    error = task.result.error
    for prefixes, kind in _FAILED_BY_PREFIX:
        if error.startswith(prefixes):
            return kind(task, _idle(task) if kind is SessionIdle else "")
    return SessionEnded(task)


def _idle(task: task_pb2.Task) -> str:
    """`idle timeout: no action for 60 s` (the session's idle timeout, from its spec)."""
    idle = task.spec.session.idle_timeout.ToTimedelta().total_seconds()
    return f"{task.result.error}: no action for {idle:g} s" if idle > 0 else ""
