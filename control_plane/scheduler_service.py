"""amc.v1.Scheduler: submit, follow and cancel tasks; see the hosts."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import structlog

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from control_plane import logs, pending, validate
from control_plane.adb_doors import ClientDoor
from control_plane.convert import (
    artifact_to_pb,
    attempt_to_pb,
    event_to_pb,
    host_to_pb,
    queue_group_to_pb,
    task_to_pb,
    timestamp,
)
from control_plane.domain import ArtifactId, NewTask, Task, TaskId
from control_plane.errors import InvalidArgument, Unavailable
from control_plane.library import check_references
from control_plane.rpc import Context, TaskServicer, conversation, principal, rpc
from control_plane.screens import ScreenWatch
from control_plane.sessions import ClientSession
from control_plane.snapshots import check_snapshots, selector_labels

log = structlog.get_logger(__name__)
DEFAULT_PAGE = 50
MAX_PAGE = 500
DEFAULT_MAX_ATTEMPTS = 3
QUEUE_GROUPS = 100
DEFAULT_EVENTS_PAGE = 100
MAX_EVENTS_PAGE = 1000


def encode_page_token(created_at: datetime, task_id: uuid.UUID) -> str:
    raw = f"{created_at.isoformat()}|{task_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str) -> tuple[datetime, uuid.UUID] | None:
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        created, task_id = raw.split("|")
        # In UTC and in PostgreSQL's range, or asyncpg fails to encode it.
        when = datetime.fromisoformat(created).astimezone(UTC)
        return when, uuid.UUID(task_id)
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise InvalidArgument("page_token", "not a token from a previous ListTasks") from None


def encode_events_token(event_id: int) -> str:
    return base64.urlsafe_b64encode(f"e{event_id}".encode()).decode().rstrip("=")


def decode_events_token(token: str) -> int:
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        if not raw.startswith("e") or not raw[1:].isdigit():
            raise ValueError(raw)
        return int(raw[1:])
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "not a token from a previous ListTaskEvents") from None


def _new_task(request: scheduler_pb2.SubmitTaskRequest, team: str = "") -> NewTask:
    """The task asked for; its fairness key the request's, else the caller's team (else
    "": the SQL makes that 'default')."""
    return NewTask(
        spec=request.spec.SerializeToString(deterministic=True),
        request_id=request.request_id or None,
        selector_serial=request.selector.serial or None,
        selector_labels=selector_labels(request.selector.labels, request.spec.start_snapshot),
        priority=request.priority,
        max_attempts=request.max_attempts or DEFAULT_MAX_ATTEMPTS,
        metadata=dict(request.metadata),
        queue_timeout=(
            request.queue_timeout.ToTimedelta() if request.HasField("queue_timeout") else None
        ),
        deadline=request.deadline.ToTimedelta() if request.HasField("deadline") else None,
        fairness_key=request.fairness_key or team,
    )


class SchedulerService(TaskServicer, scheduler_pb2_grpc.SchedulerServicer):
    @rpc
    async def SubmitTask(
        self, request: scheduler_pb2.SubmitTaskRequest, context: Context
    ) -> task_pb2.Task:
        validate.submit(request)
        ((task, _),) = await self._submit([request], grouped=True)
        return task_to_pb(task)

    @rpc
    async def SubmitTasks(
        self, request: scheduler_pb2.SubmitTasksRequest, context: Context
    ) -> scheduler_pb2.SubmitTasksResponse:
        validate.submit_batch(request)
        submitted = await self._submit(request.tasks, batch=True)
        return scheduler_pb2.SubmitTasksResponse(tasks=[task_to_pb(t) for t, _ in submitted])

    async def _submit(
        self,
        requests: Sequence[scheduler_pb2.SubmitTaskRequest],
        batch: bool = False,
        grouped: bool = False,
    ) -> list[tuple[Task, bool]]:
        """Queue the tasks asked for, as the caller (one statement); (task, created) each.
        What their specs name of the app library must be there, and the snapshots they
        start from on some host (NOT_FOUND otherwise). `grouped` (one task): written with
        the other SubmitTask calls on this replica meanwhile, one commit for them all."""
        specs = [(f"tasks[{i}].spec" if batch else "spec", r.spec) for i, r in enumerate(requests)]
        await check_references(self.store, specs)
        await check_snapshots(self.store, specs)
        who = principal()
        news = [_new_task(r, who.team) for r in requests]
        if grouped:
            (new,) = news
            submitted = [await self.store.tasks.submit_grouped(who.caller, new, name=who.name)]
        else:
            submitted = await self.store.tasks.submit_many(who.caller, news, name=who.name)
        self.effects.submitted([task for task, created in submitted if created])
        return submitted

    @rpc
    async def GetTask(
        self, request: scheduler_pb2.GetTaskRequest, context: Context
    ) -> task_pb2.Task:
        task_id = TaskId(validate.task_id(request.task_id))
        return task_to_pb(await self._read(task_id))

    async def _read(self, task_id: TaskId) -> Task:
        """The task, with its pending reason if it is queued (one statement)."""
        return await pending.read(self.store, task_id, self.settings.lease_ttl)

    async def _read_many(self, ids: list[uuid.UUID]) -> list[Task]:
        """Tasks by id, newest first: each running one with its progress (one statement),
        the queued ones then given their reasons as a page of ListTasks is (one more)."""
        ttl = self.settings.lease_ttl
        found = await self.store.tasks.read_tasks([TaskId(i) for i in ids], ttl, explain=False)
        tasks = sorted((r.task for r in found), key=lambda t: (t.created_at, t.task_id))
        return await pending.with_reasons(self.store, tasks[::-1], ttl)

    @rpc
    async def ListTaskEvents(
        self,
        request: scheduler_pb2.ListTaskEventsRequest,
        context: Context,
    ) -> scheduler_pb2.ListTaskEventsResponse:
        task_id = TaskId(validate.list_task_events(request))
        size = min(request.page_size or DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE)
        after = decode_events_token(request.page_token)
        history = await self.store.tasks.task_history(task_id, after, size + 1)
        events, token = history.events, ""
        if len(events) > size:
            events = events[:size]
            token = encode_events_token(events[-1].event_id)
        return scheduler_pb2.ListTaskEventsResponse(
            attempts=[attempt_to_pb(a) for a in history.attempts],
            events=[event_to_pb(e) for e in events],
            next_page_token=token,
        )

    @rpc
    async def ListTasks(
        self, request: scheduler_pb2.ListTasksRequest, context: Context
    ) -> scheduler_pb2.ListTasksResponse:
        statuses, host_id = validate.list_tasks(request)
        if ids := validate.listed_ids(request):
            return scheduler_pb2.ListTasksResponse(
                tasks=[task_to_pb(t) for t in await self._read_many(ids)]
            )
        size = min(request.page_size or DEFAULT_PAGE, MAX_PAGE)
        after = decode_page_token(request.page_token)
        labels, pattern = validate.task_search(request)
        tasks = await self.store.tasks.list_tasks(
            statuses, host_id, after, size + 1, labels, pattern
        )
        token = ""
        if len(tasks) > size:
            tasks = tasks[:size]
            token = encode_page_token(tasks[-1].created_at, tasks[-1].task_id)
        tasks = await pending.with_reasons(self.store, tasks, self.settings.lease_ttl)
        return scheduler_pb2.ListTasksResponse(
            tasks=[task_to_pb(t) for t in tasks], next_page_token=token
        )

    @rpc
    async def CancelTask(
        self, request: scheduler_pb2.CancelTaskRequest, context: Context
    ) -> task_pb2.Task:
        task_id = TaskId(validate.task_id(request.task_id))
        validate.reason(request.reason)
        code, task, notice = await self.store.tasks.cancel(task_id, request.reason)
        self.effects.cancelled(code, task, notice)
        return task_to_pb(task)

    @rpc
    async def WatchTask(
        self, request: scheduler_pb2.WatchTaskRequest, context: Context
    ) -> AsyncIterator[task_pb2.Task]:
        task_id = TaskId(validate.task_id(request.task_id))
        refresh = self.settings.watch_refresh.total_seconds()
        with self.hub.watch(task_id) as changed:
            last = None
            while True:
                changed.clear()
                task = await self._read(task_id)
                if task != last:
                    yield task_to_pb(task)
                    last = task
                if task.status.terminal:
                    return
                if self.hub.closing:
                    raise Unavailable("control plane shutting down; watch again")
                try:
                    await asyncio.wait_for(changed.wait(), refresh)
                except TimeoutError:
                    pass

    @rpc
    async def GetQueue(
        self, request: scheduler_pb2.GetQueueRequest, context: Context
    ) -> scheduler_pb2.GetQueueResponse:
        groups, total, counted_at = await self.store.queue.groups(QUEUE_GROUPS)
        return scheduler_pb2.GetQueueResponse(
            groups=[
                queue_group_to_pb(g, pending.explain(g.serial, g.labels, g.match)) for g in groups
            ],
            total=total,
            counted_at=timestamp(counted_at),
        )

    @rpc
    async def ListHosts(
        self, request: scheduler_pb2.ListHostsRequest, context: Context
    ) -> scheduler_pb2.ListHostsResponse:
        hosts = await self.store.hosts.list_hosts(self.settings.lease_ttl)
        return scheduler_pb2.ListHostsResponse(hosts=[host_to_pb(h) for h in hosts])

    @rpc
    async def ListArtifacts(
        self,
        request: scheduler_pb2.ListArtifactsRequest,
        context: Context,
    ) -> scheduler_pb2.ListArtifactsResponse:
        task_id = TaskId(validate.list_artifacts(request))
        found = await self.artifacts.list(task_id)
        return scheduler_pb2.ListArtifactsResponse(artifacts=[artifact_to_pb(a) for a in found])

    @rpc
    async def GetArtifact(
        self,
        request: scheduler_pb2.GetArtifactRequest,
        context: Context,
    ) -> AsyncIterator[scheduler_pb2.GetArtifactResponse]:
        task_id, artifact_id = validate.get_artifact(request)
        artifact = await self.artifacts.get(TaskId(task_id), ArtifactId(artifact_id))
        if artifact.kind == logs.KIND:  # a phone's log: read as StreamLogs reads it
            await logs.LogRead(self).authorize(task_id)
        yield scheduler_pb2.GetArtifactResponse(artifact=artifact_to_pb(artifact))
        async for chunk in self.artifacts.read(artifact):
            yield scheduler_pb2.GetArtifactResponse(chunk=chunk)

    @conversation
    def OpenSession(self, context: Context) -> ClientSession:
        """A session's client side: its actions down to the host, their answers back."""
        return ClientSession(self, self._read, context)

    @conversation
    def AdbStreams(self, context: Context) -> ClientDoor:
        """A session's adb door: its streams carried to the phone's host and back."""
        return ClientDoor(self, context)

    @rpc
    async def WatchScreen(
        self, request: scheduler_pb2.WatchScreenRequest, context: Context
    ) -> AsyncIterator[scheduler_pb2.ScreenFrame]:
        watch = ScreenWatch(self)
        async for frame in watch.run(request, context):
            yield frame

    @rpc
    async def StreamLogs(
        self, request: scheduler_pb2.StreamLogsRequest, context: Context
    ) -> AsyncIterator[scheduler_pb2.StreamLogsResponse]:
        async for message in logs.LogRead(self).run(request, context):
            yield message
