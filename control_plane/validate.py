"""Checks on incoming messages, at the gRPC edge. Each problem names its field.

Here: the limits of a request, the rules every field follows (ids, labels, text,
durations) and the Scheduler's requests (a task's spec and its submission, listings,
sessions); what hosts send is control_plane.validate_lease's, the Admin's requests
control_plane.validate_admin's."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import timedelta

from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, task_pb2
from amc_common import action_table

# The actions' limits are amc_common.action_table'; these are named here too, beside the
# other limits of a request.
from amc_common.action_table import MAX_COORD as MAX_COORD
from amc_common.action_table import MAX_SECONDS as MAX_SECONDS
from amc_common.action_table import MAX_STRING
from amc_common.action_table import MAX_TEXT as MAX_TEXT
from amc_common.device_selector import HOST_LABEL, SNAPSHOT_NAME
from control_plane import validate_webdriver
from control_plane.convert import STATUS_FROM_PB
from control_plane.errors import InvalidArgument
from control_plane.lifecycle import TaskStatus

MAX_ACTIONS = 1000
# Apps a task or session has installed before its first action (TaskSpec.apps).
MAX_APPS = 20
MAX_STEPS = 200
MAX_SPEC_BYTES = 1 << 20
MAX_MAP_ENTRIES = 64
MAX_KEY = 128
MAX_VALUE = 1024
MAX_ID = 128
MAX_PRIORITY = 1_000_000
MAX_ATTEMPTS = 100
MAX_SERIALS = 1000
MAX_LEASES_PER_RENEWAL = 10_000
MAX_BATCH = 500
MAX_DEVICES = 1000
MAX_REPORTS = 1000
# One step's result sent as progress: its output and error (4 KiB each, cut by the host),
# its data and names, with room to spare.
MAX_STEP_BYTES = 64 * 1024
# A task's limits (SubmitTaskRequest.queue_timeout and .deadline), when set: a second at
# least (the sweep runs every second), and a bound that catches a unit mistake.
MIN_LIMIT = timedelta(seconds=1)
MAX_QUEUE_TIMEOUT = timedelta(days=30)
MAX_DEADLINE = timedelta(days=7)
MAX_HOST_EVENTS = 1000
DEFAULT_HOST_EVENTS = 20
# Whole-string patterns: used with fullmatch only (`$` also matches before a final "\n").
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]*")
# Control characters (C0, DEL, C1: NUL, tab, CR, LF, VT, FF, NEL...) and the Unicode line
# and paragraph separators: never in a label or a name, where they would make two values
# that look the same differ.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def task_id(value: str, field: str = "task_id") -> uuid.UUID:
    return uuid_field(value, field, "task id")


def lease_id(value: str, field: str = "lease_id") -> uuid.UUID:
    return uuid_field(value, field, "lease id")


def uuid_field(value: str, field: str, what: str) -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"not a valid {what} (expected a UUID)") from None


def identifier(value: str, field: str, *, required: bool = True) -> str:
    """Host ids, serials, request ids: printable, no spaces, bounded."""
    if not value:
        if required:
            raise InvalidArgument(field, "required")
        return value
    if len(value) > MAX_ID:
        raise InvalidArgument(field, f"longer than {MAX_ID} characters")
    if not _ID.fullmatch(value):
        raise InvalidArgument(field, "may hold letters, digits and . _ : @ / + - only")
    return value


def string_map(
    values: dict[str, str], field: str, *, free_text_values: bool = False
) -> dict[str, str]:
    """Labels by default: keys and values printable, on one line. `free_text_values` (task
    metadata) lets values hold any text but NUL."""
    if len(values) > MAX_MAP_ENTRIES:
        raise InvalidArgument(field, f"more than {MAX_MAP_ENTRIES} entries")
    for key, value in values.items():
        if not key or len(key) > MAX_KEY:
            raise InvalidArgument(f"{field}", f"keys must be 1 to {MAX_KEY} characters")
        if len(value) > MAX_VALUE:
            raise InvalidArgument(f"{field}[{key}]", f"longer than {MAX_VALUE} characters")
        no_nul(key, field)
        no_nul(value, f"{field}[{key}]")
        printable(key, field, "a key")
        if not free_text_values:
            printable(value, f"{field}[{key}]")
    return dict(values)


def no_nul(value: str, field: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(field, "contains a NUL character")


def printable(value: str, field: str, what: str = "") -> None:
    if found := _UNPRINTABLE.search(value):
        where = f"{what} " if what else ""
        raise InvalidArgument(
            field,
            f"{where}contains U+{ord(found.group()):04X}: control characters and line breaks"
            " are not allowed",
        )


def text(value: str, field: str, *, required: bool = False, limit: int = MAX_STRING) -> None:
    if required and not value:
        raise InvalidArgument(field, "required")
    if len(value) > limit:
        raise InvalidArgument(field, f"longer than {limit} characters")
    no_nul(value, field)


def action(a: task_pb2.Action, field: str) -> None:
    """One action, against its definition in amc_common.action_table (which the host agent and
    the CLI read too)."""
    try:
        action_table.check(a)
    except action_table.ActionError as exc:
        raise InvalidArgument(f"{field}.{exc.field}" if exc.field else field, exc.problem) from None


def _actions(items: Sequence[task_pb2.Action], field: str, *, allow_empty: bool = False) -> int:
    if not items and not allow_empty:
        raise InvalidArgument(field, "needs at least one action")
    for i, a in enumerate(items):
        action(a, f"{field}[{i}]")
    return len(items)


def spec(s: task_pb2.TaskSpec, field: str = "spec") -> None:
    kind = s.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument(field, "required: set actions or workflow")
    if kind == "session":
        raise InvalidArgument(f"{field}.session", "a session is opened with Scheduler.OpenSession")
    if s.ByteSize() > MAX_SPEC_BYTES:
        raise InvalidArgument(field, f"larger than {MAX_SPEC_BYTES} bytes")
    if kind == "actions":
        count = _actions(s.actions.actions, f"{field}.actions.actions")
    else:
        steps = s.workflow.steps
        if not steps:
            raise InvalidArgument(f"{field}.workflow.steps", "needs at least one step")
        if len(steps) > MAX_STEPS:
            raise InvalidArgument(f"{field}.workflow.steps", f"more than {MAX_STEPS} steps")
        count = 0
        for i, step in enumerate(steps):
            where = f"{field}.workflow.steps[{i}]"
            text(step.name, f"{where}.name", required=True, limit=MAX_KEY)
            count += _actions(step.actions, f"{where}.actions")
    if count > MAX_ACTIONS:
        raise InvalidArgument(field, f"more than {MAX_ACTIONS} actions in all")
    if s.HasField("record_screen"):
        screen_recording(s.record_screen, f"{field}.record_screen")
    apps(s.apps, f"{field}.apps")
    start_snapshot(s.start_snapshot, f"{field}.start_snapshot")


def start_snapshot(value: str, field: str) -> None:
    """An emulator snapshot's name, when set: one word, as the emulator console takes it."""
    if value and not SNAPSHOT_NAME.fullmatch(value):
        raise InvalidArgument(
            field, "not a snapshot name: letters, digits, '.', '_', '-', at most 64"
        )


def apps(items: Sequence[task_pb2.InstallApp], field: str) -> None:
    """Apps to install before the first action: each an install_app's fields."""
    if len(items) > MAX_APPS:
        raise InvalidArgument(field, f"more than {MAX_APPS} apps")
    for i, app in enumerate(items):
        try:
            action_table.from_message(task_pb2.Action(install_app=app))
        except action_table.ActionError as exc:
            inside = exc.field.removeprefix("install_app").lstrip(".")
            raise InvalidArgument(f"{field}[{i}].{inside}", exc.problem) from None


MAX_RECORDING_FPS = 10
MAX_RECORDING_FRAMES = 3000


def screen_recording(r: task_pb2.ScreenRecording, field: str) -> None:
    if not 0 <= r.fps <= MAX_RECORDING_FPS:
        raise InvalidArgument(f"{field}.fps", f"must be 1 to {MAX_RECORDING_FPS} (0: 2)")
    if not 0 <= r.max_frames <= MAX_RECORDING_FRAMES:
        raise InvalidArgument(
            f"{field}.max_frames", f"must be 1 to {MAX_RECORDING_FRAMES} (0: 600)"
        )


def search_text(value: str, field: str = "text") -> str:
    """A search text, as a LIKE pattern matching it literally."""
    if len(value) > MAX_KEY:
        raise InvalidArgument(field, f"longer than {MAX_KEY} characters")
    no_nul(value, field)
    printable(value, field)
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def submit(req: scheduler_pb2.SubmitTaskRequest) -> None:
    identifier(req.request_id, "request_id", required=False)
    spec(req.spec)
    identifier(req.selector.serial, "selector.serial", required=False)
    string_map(dict(req.selector.labels), "selector.labels")
    if abs(req.priority) > MAX_PRIORITY:
        raise InvalidArgument("priority", f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    if not 0 <= req.max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(
            "max_attempts", f"must be between 1 and {MAX_ATTEMPTS} (0 for the default)"
        )
    string_map(dict(req.metadata), "metadata", free_text_values=True)
    if req.HasField("queue_timeout"):
        limit(req.queue_timeout, "queue_timeout", MAX_QUEUE_TIMEOUT)
    if req.HasField("deadline"):
        limit(req.deadline, "deadline", MAX_DEADLINE)
    identifier(req.fairness_key, "fairness_key", required=False)


def limit(d: duration_pb2.Duration, field: str, most: timedelta) -> timedelta:
    """A task's queue timeout or deadline, when set: MIN_LIMIT to `most`."""
    if d.seconds < 0 or d.nanos < 0 or d.nanos >= 1_000_000_000:
        raise InvalidArgument(field, "must be a positive duration")
    # Seconds first: a malformed Duration may be past what a timedelta holds.
    if d.seconds > most.total_seconds():
        value = most + MIN_LIMIT  # past the bound, whatever it was
    else:
        value = timedelta(seconds=d.seconds, microseconds=d.nanos // 1000)
    if not MIN_LIMIT <= value <= most:
        raise InvalidArgument(field, f"must be between {_span(MIN_LIMIT)} and {_span(most)}")
    return value


def _span(value: timedelta) -> str:
    """1s, 30 days: how the limits read in a message."""
    return f"{value.days} days" if value.days else f"{value.total_seconds():g}s"


def submit_batch(req: scheduler_pb2.SubmitTasksRequest) -> None:
    if not req.tasks:
        raise InvalidArgument("tasks", "at least one task")
    if len(req.tasks) > MAX_BATCH:
        raise InvalidArgument("tasks", f"at most {MAX_BATCH} tasks in one call")
    first_with: dict[str, int] = {}
    for i, task in enumerate(req.tasks):
        try:
            submit(task)
        except InvalidArgument as exc:
            raise InvalidArgument(f"tasks[{i}].{exc.field}", exc.problem) from None
        if task.request_id:
            if task.request_id in first_with:
                raise InvalidArgument(
                    f"tasks[{i}].request_id", f"repeats tasks[{first_with[task.request_id]}]"
                )
            first_with[task.request_id] = i


def reason(value: str, field: str = "reason") -> str:
    """Why a task is cancelled or a lease given back: free text, bounded, no NUL."""
    if len(value) > MAX_VALUE or "\x00" in value:
        raise InvalidArgument(field, f"at most {MAX_VALUE} characters, no NUL")
    return value


def list_tasks(req: scheduler_pb2.ListTasksRequest) -> tuple[list[TaskStatus], str | None]:
    """ListTasks' filters: the statuses asked for (none: all) and the host (None: any)."""
    statuses = []
    for i, value in enumerate(req.statuses):
        if value not in STATUS_FROM_PB:
            raise InvalidArgument(f"statuses[{i}]", f"unknown task status {value}")
        statuses.append(STATUS_FROM_PB[value])
    host_id = identifier(req.host_id, "host_id", required=False) or None
    if req.page_size < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return statuses, host_id


MAX_TASK_IDS = 500


def listed_ids(req: scheduler_pb2.ListTasksRequest) -> list[uuid.UUID]:
    """ListTasks' `task_ids` (none: the filters' listing), alone."""
    if not req.task_ids:
        return []
    if len(req.task_ids) > MAX_TASK_IDS:
        raise InvalidArgument("task_ids", f"at most {MAX_TASK_IDS}")
    filtered = req.statuses or req.host_id or req.selector_labels or req.text or req.page_token
    if filtered:
        raise InvalidArgument("task_ids", "tasks by id alone: no filter or page_token with it")
    return [task_id(t, f"task_ids[{i}]") for i, t in enumerate(req.task_ids)]


def task_search(req: scheduler_pb2.ListTasksRequest) -> tuple[dict[str, str], str]:
    """ListTasks' search: the selector labels a task must carry, and its text as a LIKE
    pattern."""
    return string_map(dict(req.selector_labels), "selector_labels"), search_text(req.text)


def list_task_events(req: scheduler_pb2.ListTaskEventsRequest) -> uuid.UUID:
    """ListTaskEvents' task (its page size and token are checked as ListTasks' are)."""
    task = task_id(req.task_id)
    if req.page_size < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return task


def list_artifacts(req: scheduler_pb2.ListArtifactsRequest) -> uuid.UUID:
    return task_id(req.task_id)


def get_artifact(req: scheduler_pb2.GetArtifactRequest) -> tuple[uuid.UUID, uuid.UUID]:
    return task_id(req.task_id), uuid_field(req.artifact_id, "artifact_id", "artifact id")


MAX_IDLE_TIMEOUT = timedelta(hours=1)


def session_open(req: scheduler_pb2.OpenSessionRequest) -> scheduler_pb2.SessionOpen:
    """The first message of an OpenSession stream: `open`, every field checked."""
    if req.WhichOneof("part") != "open":
        raise InvalidArgument("open", "required: the first message asks for the phone")
    o = req.open
    identifier(o.selector.serial, "open.selector.serial", required=False)
    string_map(dict(o.selector.labels), "open.selector.labels")
    if not o.HasField("idle_timeout"):
        raise InvalidArgument("open.idle_timeout", "required")
    limit(o.idle_timeout, "open.idle_timeout", MAX_IDLE_TIMEOUT)
    if o.HasField("max_duration"):
        limit(o.max_duration, "open.max_duration", MAX_DEADLINE)
    if o.HasField("queue_timeout"):
        limit(o.queue_timeout, "open.queue_timeout", MAX_QUEUE_TIMEOUT)
    if abs(o.priority) > MAX_PRIORITY:
        raise InvalidArgument(
            "open.priority", f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"
        )
    string_map(dict(o.metadata), "open.metadata", free_text_values=True)
    identifier(o.fairness_key, "open.fairness_key", required=False)
    identifier(o.request_id, "open.request_id", required=False)
    if o.HasField("record_screen"):
        screen_recording(o.record_screen, "open.record_screen")
    start_snapshot(o.start_snapshot, "open.start_snapshot")
    apps(o.apps, "open.apps")
    if o.maintenance and not (o.selector.serial and set(o.selector.labels) == {HOST_LABEL}):
        raise InvalidArgument(
            "open.maintenance",
            f"a maintenance session names one phone: selector.serial and the {HOST_LABEL}"
            " label, and nothing else",
        )
    return o


def session_action(req: scheduler_pb2.OpenSessionRequest) -> task_pb2.SessionAction:
    """A later message of an OpenSession stream: one action."""
    if req.WhichOneof("part") != "action":
        raise InvalidArgument("open", "only the first message asks for the phone")
    if req.action.HasField("webdriver"):
        if req.action.HasField("action"):
            raise InvalidArgument("action.webdriver", "a WebDriver command stands alone")
        validate_webdriver.command(req.action.webdriver)
        return req.action
    if not req.action.HasField("action"):
        raise InvalidArgument("action.action", "required")
    action(req.action.action, "action.action")
    return req.action
