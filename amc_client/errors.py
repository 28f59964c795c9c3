"""What amc_client raises.

    AmcClientError
    ├── SessionRefused   the session could not start (refused, or its task ended first)
    ├── SessionEnded     the session is over (cancelled, lease lost, idle, deadline)
    └── ActionFailed     an action of a session failed; the session goes on

gRPC errors that are not transient (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED…)
propagate as `grpc.aio.AioRpcError`, unchanged.
"""

from __future__ import annotations

from amc.v1 import task_pb2


class AmcClientError(Exception):
    """Something amc_client could not do."""


class SessionRefused(AmcClientError):
    """The session never got its phone."""

    def __init__(self, message: str, task: task_pb2.Task | None = None) -> None:
        super().__init__(message)
        self.task = task


class SessionEnded(AmcClientError):
    """The session is over; `task` is its finished task (status and result)."""

    def __init__(self, task: task_pb2.Task | None) -> None:
        status = task_pb2.TaskStatus.Name(task.status) if task is not None else "unknown"
        error = task.result.error if task is not None else ""
        super().__init__(f"session ended: {status}" + (f": {error}" if error else ""))
        self.task = task


class ActionFailed(AmcClientError):
    """One action failed on the phone (a selector not found, a shell error…)."""

    def __init__(self, step: task_pb2.StepResult) -> None:
        super().__init__(f"{step.name} failed: {step.error}")
        self.step = step
