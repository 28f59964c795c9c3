"""The connection to a farm: ordinary tasks (submit, get, wait, watch, cancel), interactive
sessions (`session`) and their phones' logs (`logs`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType

import grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_client.actions import apps as install_apps
from amc_client.actions import seconds
from amc_client.errors import AmcClientError
from amc_client.opening import DEFAULT_QUEUE_TIMEOUT, open_phone
from amc_client.phone import TERMINAL, Phone
from amc_client.retry import DEFAULT_RETRY, Reach, Retry, transient
from amc_common.channel import DEFAULT_PORT, aio_channel, with_default_port, with_token

__all__ = ["DEFAULT_QUEUE_TIMEOUT", "TERMINAL", "Farm"]


class Farm:
    """`async with Farm(address, token=...) as farm:` — one channel to the control plane.

    Calls that are safe to repeat (get, cancel, submit with its request id, a watch that
    resumes) are tried again on transient errors (UNAVAILABLE: a replica restarting, a
    reset connection) within `retry`'s budget; others propagate as grpc.aio.AioRpcError.

    `channel`: a channel of the caller's to the control plane (the address, `ca_file` and
    `tls` are then unused), which the Farm neither opens nor closes; the token is still
    sent on each of its calls. Several Farms, one per token, may share one connection so.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        *,
        ca_file: str | Path | None = None,
        tls: bool = False,
        retry: Retry = DEFAULT_RETRY,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self._address = with_default_port(address, DEFAULT_PORT)
        self._token, self._ca_file, self._tls = token, ca_file, tls
        self.retry = retry
        self._shared = channel
        self._reach = Reach(self._address)
        self._channel: grpc.aio.Channel | None = None
        self._stub: scheduler_pb2_grpc.SchedulerStub | None = None

    async def __aenter__(self) -> Farm:
        if self._shared is not None:
            self._channel = with_token(self._shared, self._token)
        else:
            self._channel = aio_channel(self._address, self._token, self._ca_file, tls=self._tls)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._channel is not None and self._shared is None:
            await self._channel.close()
        self._channel = self._stub = None

    @property
    def scheduler(self) -> scheduler_pb2_grpc.SchedulerStub:
        """The raw amc.v1.Scheduler stub, for what this class does not wrap."""
        if self._stub is None:
            raise AmcClientError("use the Farm inside `async with`")
        return self._stub

    # -- ordinary tasks ---------------------------------------------------------------------

    async def submit(
        self,
        spec: Sequence[task_pb2.Action] | task_pb2.TaskSpec,
        *,
        labels: Mapping[str, str] | None = None,
        serial: str = "",
        priority: int = 0,
        max_attempts: int = 0,
        metadata: Mapping[str, str] | None = None,
        queue_timeout: float | None = None,
        deadline: float | None = None,
        fairness_key: str = "",
        request_id: str | None = None,
    ) -> task_pb2.Task:
        """Queue a task: a list of actions (run in order) or a whole TaskSpec. The request
        id (a fresh one by default) makes a retry after a lost answer the same task."""
        if not isinstance(spec, task_pb2.TaskSpec):
            spec = task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=list(spec)))
        request = scheduler_pb2.SubmitTaskRequest(
            request_id=request_id or uuid.uuid4().hex,
            spec=spec,
            selector=task_pb2.DeviceSelector(serial=serial, labels=dict(labels or {})),
            priority=priority,
            max_attempts=max_attempts,
            metadata=dict(metadata or {}),
            fairness_key=fairness_key,
        )
        if queue_timeout is not None:
            request.queue_timeout.CopyFrom(seconds(queue_timeout))
        if deadline is not None:
            request.deadline.CopyFrom(seconds(deadline))
        task: task_pb2.Task = await self.retry.call(
            lambda: self.scheduler.SubmitTask(request), self._reach
        )
        return task

    async def get(self, task_id: str) -> task_pb2.Task:
        request = scheduler_pb2.GetTaskRequest(task_id=task_id)
        task: task_pb2.Task = await self.retry.call(
            lambda: self.scheduler.GetTask(request), self._reach
        )
        return task

    async def cancel(self, task_id: str, reason: str = "") -> task_pb2.Task:
        """Ask for the task's cancellation (repeating it is harmless)."""
        request = scheduler_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        task: task_pb2.Task = await self.retry.call(
            lambda: self.scheduler.CancelTask(request), self._reach
        )
        return task

    async def watch(self, task_id: str) -> AsyncIterator[task_pb2.Task]:
        """The task now, then each change, ending after a terminal state; a watch cut by
        a transient error resumes (a state seen already is not repeated)."""
        last: task_pb2.Task | None = None
        while True:
            try:
                async for task in self.scheduler.WatchTask(
                    scheduler_pb2.WatchTaskRequest(task_id=task_id)
                ):
                    if task != last:
                        yield task
                        last = task
                    if task.status in TERMINAL:
                        return
            except grpc.aio.AioRpcError as exc:
                self._reach.heard(exc)
                if not transient(exc):
                    raise
                await asyncio.sleep(self.retry.first)

    async def wait(self, task_id: str, timeout: float | None = None) -> task_pb2.Task:
        """The task once it finished (done, failed or cancelled)."""
        async with asyncio.timeout(timeout):
            async for task in self.watch(task_id):
                if task.status in TERMINAL:
                    return task
        raise AmcClientError(f"the watch of task {task_id} ended before it finished")

    async def logs(
        self,
        task_id: str,
        *,
        attempt: int = 0,
        follow: bool = False,
        level: str = "",
        tags: Sequence[str] = (),
    ) -> AsyncIterator[str]:
        """A task's phone log, line by line as logcat writes it (`-v threadtime`), with the
        lines marking where each step began and ended (Scheduler.StreamLogs): the log an
        ended attempt kept, or the running attempt's lines so far; with `follow`, each
        line as the phone writes it until the attempt ends (a task still queued, or a
        session's, is waited for). `attempt`: 0 for the latest; `level`: only lines of that
        priority or higher (V, D, I, W, E, F); `tags`: only lines of those tags. Errors
        propagate as grpc.aio.AioRpcError (INVALID_ARGUMENT: a bad filter; NOT_FOUND: no
        such task), or FarmUnreachable for an address that never answered. Not resumed
        after a transient error, as its lines carry no number to resume from: a follow
        cut short (UNAVAILABLE) is followed again by the caller."""
        request = scheduler_pb2.StreamLogsRequest(
            task_id=task_id, attempt=attempt, follow=follow, min_level=level, tags=list(tags)
        )
        try:
            async for message in self.scheduler.StreamLogs(request):
                for line in message.lines:
                    yield line
        except grpc.aio.AioRpcError as exc:
            self._reach.heard(exc)
            raise

    # -- sessions ---------------------------------------------------------------------------

    async def open_session(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        serial: str = "",
        idle_timeout: float = 60.0,
        max_duration: float | None = None,
        queue_timeout: float | None = DEFAULT_QUEUE_TIMEOUT,
        fairness_key: str = "",
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        on_wait: Callable[[task_pb2.Task], None] | None = None,
        apps: Sequence[str | task_pb2.InstallApp] = (),
        start_snapshot: str = "",
    ) -> Phone:
        """The phone of a new session, once its host joined; end it with `close()` (done)
        or `abandon()` (failed, "session abandoned"). For a holder that outlives a block
        (an MCP server); `session` is the same as a block. Arguments as `session`'s."""
        opening = scheduler_pb2.SessionOpen(
            selector=task_pb2.DeviceSelector(serial=serial, labels=dict(labels or {})),
            idle_timeout=seconds(idle_timeout),
            fairness_key=fairness_key,
            priority=priority,
            metadata=dict(metadata or {}),
            apps=install_apps(apps),
            start_snapshot=start_snapshot,
        )
        if max_duration is not None:
            opening.max_duration.CopyFrom(seconds(max_duration))
        if queue_timeout is not None:
            opening.queue_timeout.CopyFrom(seconds(queue_timeout))
        return await open_phone(
            self.scheduler,
            self.retry,
            opening,
            reach=self._reach,
            queue_timeout=queue_timeout,
            on_wait=on_wait,
            finished=lambda task_id: self.wait(task_id),
        )

    @asynccontextmanager
    async def session(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        serial: str = "",
        idle_timeout: float = 60.0,
        max_duration: float | None = None,
        queue_timeout: float | None = DEFAULT_QUEUE_TIMEOUT,
        fairness_key: str = "",
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        on_wait: Callable[[task_pb2.Task], None] | None = None,
        apps: Sequence[str | task_pb2.InstallApp] = (),
        start_snapshot: str = "",
    ) -> AsyncIterator[Phone]:
        """A phone of one's own until the block ends (the task ends done).

        It waits for a matching phone first, for at most `queue_timeout` seconds (None: as
        long as it takes), then raises NoPhone with the last reason the wait was given;
        `on_wait` is told each state of the queued task at once (its `pending_reason` says
        why it waits), and a selector no registered phone fits is logged as a warning on
        the `amc_client` logger at once. `idle_timeout`: the longest pause between two
        actions before the control plane ends the session (SessionIdle); `max_duration`:
        the longest it may run (SessionDeadline). `apps`: apps of the farm's library
        installed before the first action, as the session's step 0 "apps" (an app id or a
        package name, replacing an installed copy; an InstallApp for other flags): one
        the library lacks is refused NOT_FOUND, a failed install raises SessionRefused,
        and the time they take is not counted in `queue_timeout`. `start_snapshot`: the
        emulator snapshot the session starts from (a phone of a host's emulator pool that
        has it; a name no host has is refused NOT_FOUND). An exception out of the block
        abandons the session (the task ends failed, "session abandoned")."""
        phone = await self.open_session(
            labels=labels,
            serial=serial,
            idle_timeout=idle_timeout,
            max_duration=max_duration,
            queue_timeout=queue_timeout,
            fairness_key=fairness_key,
            priority=priority,
            metadata=metadata,
            on_wait=on_wait,
            apps=apps,
            start_snapshot=start_snapshot,
        )
        try:
            yield phone
        except BaseException:
            phone.abandon()
            raise
        await phone.close()
