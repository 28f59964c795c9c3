"""A synchronous client for the Scheduler and Admin services.

A command-line call makes a handful of requests and exits, so the blocking gRPC API is
the simple fit. The bearer token rides on each call as metadata, which works the same over
plaintext and TLS. Every failure leaves here as an `RpcFailed` naming what was being done.

Calls that are idempotent (CancelTask: cancelling twice is cancelling once; GetHost) are
tried again while a control plane that has answered this client before is UNAVAILABLE
(restarting, its database away), with exponential backoff and jitter, for at most the
target's `timeout` in all; or, with `retry_for`, for that long whether it answered before or
not. An address that never answered (a typo'd port refuses at once) fails at once. The
person is told once per change of state (unavailable and why, then back), not per try.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from amc.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_cli import diagnose
from amc_cli.errors import BadInput, rpc_failed
from amc_common import unreachable
from amc_common.channel import CHANNEL_OPTIONS

R = TypeVar("R")

# Retries of an idempotent call: 0.25 s, 0.5 s, 1 s, … up to 5 s apart, each plus up to
# 0.25 s of jitter, while the next attempt would still start within the timeout.
RETRY_FIRST_BACKOFF = 0.25
RETRY_MAX_BACKOFF = 5.0
RETRY_JITTER = 0.25
# gRPC's own reconnect backoff grows to 120 s; a retried call must find the server back
# within seconds of its return, so the channel tries to connect again at least this often.
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


@dataclass(frozen=True)
class Target:
    """Where the control plane is and how to talk to it."""

    address: str
    token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    tls: bool = False
    timeout: float = 30.0
    # Seconds an idempotent call keeps trying an unavailable control plane, even one that
    # never answered; None: `timeout`, and only once it has answered.
    retry_for: float | None = None


def read_token(token: str | None, token_file: Path | None) -> str | None:
    """The token given, else the one in `token_file` (see `app.token_source` for which of
    the two wins when both are set)."""
    if token:
        return token.strip()
    if token_file is None:
        return None
    try:
        return token_file.read_text().strip() or None
    except OSError as exc:
        raise BadInput(f"cannot read token file {token_file}: {exc.strerror or exc}") from None


def open_channel(target: Target) -> grpc.Channel:
    options = [*CHANNEL_OPTIONS, *RECONNECT_OPTIONS]
    if not (target.ca_file or target.tls):
        return grpc.insecure_channel(target.address, options=options)
    root = None
    if target.ca_file:
        try:
            root = target.ca_file.read_bytes()
        except OSError as exc:
            raise BadInput(f"cannot read CA file {target.ca_file}: {exc.strerror or exc}") from None
    creds = grpc.ssl_channel_credentials(root)
    return grpc.secure_channel(target.address, creds, options=options)


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE


class Client:
    def __init__(self, target: Target, on_retry: Callable[[str], None] | None = None) -> None:
        self.target = target
        # Told about each retry of an idempotent call (a note for the person at the terminal).
        self.on_retry = on_retry
        self._channel = open_channel(target)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._metadata = (("authorization", f"Bearer {target.token}"),) if target.token else ()
        # Whether the control plane has answered this client (anything but UNAVAILABLE).
        self.answered = False

    def close(self) -> None:
        self._channel.close()

    def _heard(self, exc: BaseException | None = None) -> None:
        if exc is None or not _unavailable(exc):
            self.answered = True

    def _call(self, doing: str, method: Callable[..., R], request: Any) -> R:
        try:
            answer = method(request, metadata=self._metadata, timeout=self.target.timeout)
        except grpc.RpcError as exc:
            self._heard(exc)
            raise self.failed(exc, doing) from None
        self._heard()
        return answer

    def _retry_budget(self) -> float:
        if self.target.retry_for is not None:
            return self.target.retry_for
        return self.target.timeout if self.answered else 0.0

    def _call_idempotent(self, doing: str, method: Callable[..., R], request: Any) -> R:
        """`_call`, tried again while the control plane is UNAVAILABLE (see the module's
        docstring for when and how long): backoff with jitter, every attempt starting
        within the budget and ending by then too; a note when the state changes."""
        budget = self._retry_budget()
        deadline = time.monotonic() + max(budget, self.target.timeout)
        told: list[str] = []

        def before_sleep(attempt: RetryCallState) -> None:
            state = unreachable.state(attempt.outcome.exception() if attempt.outcome else None)
            if told and told[-1] == state:
                return
            again = "still unavailable" if told else "unavailable"
            told.append(state)
            self._note(
                f"{doing}: the control plane at {self.target.address} is {again} ({state}); "
                f"trying again for up to {budget:g}s"
            )

        retrying = Retrying(
            retry=retry_if_exception(_unavailable),
            # wait_exponential_jitter's `initial` is deprecated in newer tenacity releases
            # and its replacement missing from older ones: the same sum, by parts.
            wait=wait_exponential(multiplier=RETRY_FIRST_BACKOFF, max=RETRY_MAX_BACKOFF)
            + wait_random(0, RETRY_JITTER),
            stop=stop_before_delay(budget),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    left = max(deadline - time.monotonic(), 0.05)
                    answer = method(request, metadata=self._metadata, timeout=left)
        except grpc.RpcError as exc:
            self._back(exc, doing, told)
            raise self.failed(exc, doing) from None
        self._back(None, doing, told)
        return answer

    def _back(self, exc: grpc.RpcError | None, doing: str, told: list[str]) -> None:
        """The call's last try ended with `exc` (None: an answer): whether the control plane
        answered, and if it was said to be unavailable, that it is back."""
        self._heard(exc)
        if told and (exc is None or not _unavailable(exc)):
            self._note(f"{doing}: the control plane at {self.target.address} answers again")

    def _note(self, message: str) -> None:
        if self.on_retry is not None:
            self.on_retry(message)

    def failed(self, exc: grpc.RpcError, doing: str) -> Exception:
        why = None
        if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE:
            conn = diagnose.Connection(self.target.address, self.target.ca_file, self.target.tls)
            details = " ".join((exc.details() or "").split())
            why = diagnose.unavailable(self._channel, conn, doing, details)
        return rpc_failed(exc, doing, self.target.address, bool(self.target.token), why)

    # -- Scheduler --------------------------------------------------------------------------

    def submit(self, request: scheduler_pb2.SubmitTaskRequest) -> task_pb2.Task:
        return self._call("submit", self._scheduler.SubmitTask, request)

    def get_task(self, task_id: str) -> task_pb2.Task:
        request = scheduler_pb2.GetTaskRequest(task_id=task_id)
        return self._call("get task", self._scheduler.GetTask, request)

    def task_history(
        self, task_id: str, page_size: int = 1000
    ) -> tuple[list[scheduler_pb2.TaskAttempt], list[scheduler_pb2.TaskEvent]]:
        """The task's attempts and all its events, oldest first (paged through)."""
        events: list[scheduler_pb2.TaskEvent] = []
        token = ""
        while True:
            request = scheduler_pb2.ListTaskEventsRequest(
                task_id=task_id, page_size=page_size, page_token=token
            )
            page = self._call("list task events", self._scheduler.ListTaskEvents, request)
            events.extend(page.events)
            token = page.next_page_token
            if not token:
                return list(page.attempts), events

    def cancel(self, task_id: str, reason: str) -> task_pb2.Task:
        """Idempotent, so retried while the control plane is unavailable."""
        request = scheduler_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        return self._call_idempotent("cancel task", self._scheduler.CancelTask, request)

    def list_tasks(
        self, statuses: list[task_pb2.TaskStatus], host_id: str, limit: int, page_size: int = 500
    ) -> tuple[list[task_pb2.Task], str]:
        """Pages through ListTasks until `limit` tasks (0: all); returns them and the token
        of the next page, empty when there is none."""
        tasks: list[task_pb2.Task] = []
        token = ""
        while True:
            size = min(limit - len(tasks), page_size) if limit else page_size
            request = scheduler_pb2.ListTasksRequest(
                statuses=statuses, host_id=host_id, page_size=size, page_token=token
            )
            page = self._call("list tasks", self._scheduler.ListTasks, request)
            tasks.extend(page.tasks)
            token = page.next_page_token
            if not token or (limit and len(tasks) >= limit):
                return tasks, token

    def watch(self, task_id: str) -> Iterator[task_pb2.Task]:
        """The task's current state, then each change; ends after a terminal state. No
        deadline: a task may take as long as it takes. Raises grpc.RpcError as is, so the
        caller can tell a dropped stream from a refusal."""
        request = scheduler_pb2.WatchTaskRequest(task_id=task_id)
        for task in self._scheduler.WatchTask(request, metadata=self._metadata):
            self._heard()
            yield task

    def list_artifacts(self, task_id: str) -> list[task_pb2.Artifact]:
        request = scheduler_pb2.ListArtifactsRequest(task_id=task_id)
        return list(self._call("list artifacts", self._scheduler.ListArtifacts, request).artifacts)

    def get_artifact(self, task_id: str, artifact_id: str) -> Iterator[bytes]:
        """The artifact's bytes, chunk by chunk (the first message, its description, is
        skipped: the caller has it from ListArtifacts)."""
        request = scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=artifact_id)
        try:
            for message in self._scheduler.GetArtifact(
                request, metadata=self._metadata, timeout=self.target.timeout
            ):
                if message.chunk:
                    yield message.chunk
        except grpc.RpcError as exc:
            raise self.failed(exc, "get artifact") from None

    def stream_logs(
        self, task_id: str, attempt: int, follow: bool, level: str, tags: list[str]
    ) -> Iterator[scheduler_pb2.StreamLogsResponse]:
        """A task's phone log, message by message; no deadline (a follow lasts as long as
        the attempt). Raises grpc.RpcError as is."""
        request = scheduler_pb2.StreamLogsRequest(
            task_id=task_id, attempt=attempt, follow=follow, min_level=level, tags=tags
        )
        for message in self._scheduler.StreamLogs(request, metadata=self._metadata):
            self._heard()
            yield message

    def list_hosts(self) -> scheduler_pb2.ListHostsResponse:
        return self._call("list hosts", self._scheduler.ListHosts, scheduler_pb2.ListHostsRequest())

    def get_queue(self) -> scheduler_pb2.GetQueueResponse:
        return self._call("get queue", self._scheduler.GetQueue, scheduler_pb2.GetQueueRequest())

    # -- Admin ------------------------------------------------------------------------------

    def create_token(
        self, role: admin_pb2.Role, host_id: str, name: str, team: str = ""
    ) -> admin_pb2.CreateTokenResponse:
        request = admin_pb2.CreateTokenRequest(role=role, host_id=host_id, name=name, team=team)
        return self._call("create token", self._admin.CreateToken, request)

    def list_tokens(self) -> admin_pb2.ListTokensResponse:
        return self._call("list tokens", self._admin.ListTokens, admin_pb2.ListTokensRequest())

    def revoke_token(self, token_id: str) -> admin_pb2.RevokeTokenResponse:
        request = admin_pb2.RevokeTokenRequest(token_id=token_id)
        return self._call("revoke token", self._admin.RevokeToken, request)

    # -- Admin: hosts and devices -------------------------------------------------------------

    def host_operation(
        self, operation: str, host_id: str, reason: str
    ) -> admin_pb2.HostOperationResponse:
        """CordonHost, UncordonHost or DrainHost (`operation`: cordon, uncordon, drain)."""
        name = f"{operation.capitalize()}Host"
        request = getattr(admin_pb2, f"{name}Request")(host_id=host_id, reason=reason)
        method = getattr(self._admin, name)
        # Each records an event, so not tried again blindly.
        return self._call(f"{operation} host", method, request)  # type: ignore[no-any-return]

    def device_operation(
        self, operation: str, host_id: str, serial: str, reason: str
    ) -> admin_pb2.DeviceOperationResponse:
        """CordonDevice, UncordonDevice or ReleaseDevice (`operation`: cordon, uncordon,
        release)."""
        name = f"{operation.capitalize()}Device"
        request = getattr(admin_pb2, f"{name}Request")(
            host_id=host_id, serial=serial, reason=reason
        )
        method = getattr(self._admin, name)
        return self._call(f"{operation} device", method, request)  # type: ignore[no-any-return]

    def remove_host(self, host_id: str, reason: str) -> None:
        request = admin_pb2.RemoveHostRequest(host_id=host_id, reason=reason)
        self._call("remove host", self._admin.RemoveHost, request)

    def get_host(self, host_id: str, events: int = 0) -> admin_pb2.GetHostResponse:
        request = admin_pb2.GetHostRequest(host_id=host_id, events=events)
        return self._call_idempotent("get host", self._admin.GetHost, request)

    # -- Admin: fair shares -------------------------------------------------------------------

    def list_fair_shares(self) -> admin_pb2.ListFairSharesResponse:
        request = admin_pb2.ListFairSharesRequest()
        return self._call("list fair shares", self._admin.ListFairShares, request)

    def get_fair_share(self, key: str, events: int = 0) -> admin_pb2.GetFairShareResponse:
        request = admin_pb2.GetFairShareRequest(fairness_key=key, events=events)
        return self._call("get fair share", self._admin.GetFairShare, request)

    def set_fair_share(
        self, key: str, weight: int, max_devices: int | None, no_cap: bool, reason: str
    ) -> admin_pb2.SetFairShareResponse:
        """Each call records an event, so it is not tried again blindly."""
        request = admin_pb2.SetFairShareRequest(
            fairness_key=key,
            weight=weight,
            max_devices=max_devices,
            clear_max_devices=no_cap,
            reason=reason,
        )
        return self._call("set fair share", self._admin.SetFairShare, request)
