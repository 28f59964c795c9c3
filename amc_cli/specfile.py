"""Task-spec files (YAML or JSON) -> `SubmitTaskRequest`.

A file is a mapping with `actions:` (a list of actions) or `workflow:` (named steps), plus
optional `selector`, `priority`, `max_attempts`, `metadata`, `request_id`, `queue_timeout`
and `deadline` (durations, like `wait`'s) and `fairness_key`; a bare list
is an actions list. An action is a one-key mapping, `kind: arguments`, where the kinds and
their fields are those of `amc.v1.Action` as amc_common.action_table defines them, and
shorthands spare the common cases: a list gives the fields in their order, a lone value
the one field that must be given.

    - tap: [540, 1200]                      # or {x: 540, y: 1200}
    - tap_on: "Log in"                      # or {text: ...}, {resource_id: ...}, {selector: ...}
    - input_text: "alice@example.com"
    - key: enter                            # a name from amc_common.keycodes, or a number
    - wait: 2s                              # durations: 2s, 500ms, 1m30s, 1.5 (seconds)
    - shell: "pm list packages"             # or {command: ..., timeout: 5s}
    - screenshot                            # no arguments (keeps the PNG)
    - ui_dump                               # no arguments (keeps the uiautomator XML)
    - install_app: com.example.app          # or {app: ID or package, replace: true, ...}
    - push_file: [FILE_ID, /sdcard/x.bin]   # a library file (amc files upload) to a path
    - pull_file: /sdcard/x.bin              # kept as an artifact of the task

`apps:` (beside `actions:` or `workflow:`) lists apps of the library to install before the
first action, each a package, an app id, or a mapping as install_app takes.
`start_snapshot:` names the emulator snapshot the task starts from (one word: letters,
digits, `.`, `_`, `-`): it then waits for an emulator that has it, which loads it first.

The document is normalised against the message descriptors (names checked, durations
turned into proto JSON, scalars coerced) and then handed to `json_format.ParseDict`. Each
action is checked against its definition in amc_common.action_table, the same check the
control plane makes, so a value past a limit is refused here, before anything is sent.
Each problem is reported with the file, the line (YAML) and the path inside the document;
what only the server checks (priority, labels, sizes) comes back naming the field too.

Reading the file and the line of each part is specdoc's; single values (text, numbers,
key names) specvalues'; durations amc_common.durations' (every program's grammar).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from google.protobuf import duration_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.errors import SpecError
from amc_cli.specdoc import Doc, parse, read
from amc_cli.specvalues import describe, scalar, suggest
from amc_common.action_table import FIELDS, ActionError, from_message
from amc_common.device_selector import SNAPSHOT_NAME
from amc_common.durations import parse_duration

_TOP_LEVEL = [
    "actions",
    "workflow",
    "selector",
    "priority",
    "max_attempts",
    "metadata",
    "request_id",
    "spec",
    "queue_timeout",
    "deadline",
    "fairness_key",
    "apps",
    "start_snapshot",
]


def load_request(path: str) -> scheduler_pb2.SubmitTaskRequest:
    """Read FILE (or stdin for `-`) and build the request it describes."""
    source, text = read(path)
    doc = parse(source, text, as_json=path.lower().endswith(".json"))
    return _Builder(doc).request()


def with_flags(
    request: scheduler_pb2.SubmitTaskRequest,
    *,
    serial: str | None = None,
    labels: Mapping[str, str] | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    request_id: str | None = None,
    metadata: Mapping[str, str] | None = None,
    queue_timeout: duration_pb2.Duration | None = None,
    deadline: duration_pb2.Duration | None = None,
    fairness_key: str | None = None,
) -> scheduler_pb2.SubmitTaskRequest:
    """Command-line flags win over the file; labels and metadata merge key by key."""
    out = scheduler_pb2.SubmitTaskRequest()
    out.CopyFrom(request)
    if serial is not None:
        out.selector.serial = serial
    out.selector.labels.update(labels or {})
    if priority is not None:
        out.priority = priority
    if max_attempts is not None:
        out.max_attempts = max_attempts
    if request_id is not None:
        out.request_id = request_id
    out.metadata.update(metadata or {})
    if queue_timeout is not None:
        out.queue_timeout.CopyFrom(queue_timeout)
    if deadline is not None:
        out.deadline.CopyFrom(deadline)
    if fairness_key is not None:
        out.fairness_key = fairness_key
    return out


# -- reading and parsing ---------------------------------------------------------------------


# -- normalising against the descriptors -----------------------------------------------------


def _repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def _is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


class _Builder:
    """Walks the document beside the message descriptors, producing proto JSON."""

    def __init__(self, doc: Doc) -> None:
        self.doc = doc

    def fail(self, parent: Any, key: Hashable, value: Any, path: str, problem: str) -> SpecError:
        return self.doc.error(parent, key, value, path, problem)

    def request(self) -> scheduler_pb2.SubmitTaskRequest:
        data = self.doc.data
        if isinstance(data, list):
            data = {"actions": data}
            self.doc.remember(data, 1)
        if not isinstance(data, dict):
            problem = f"expected a mapping with actions or workflow, got {describe(data)}"
            raise self.fail(None, None, data, "", problem)
        out: dict[str, Any] = {}
        spec: dict[str, Any] = {}
        apps: list[Any] = []
        spec_fields: dict[str, Any] = {}
        for key, value in data.items():
            if key == "apps":
                apps = self.apps(value, data, key)
            elif key == "start_snapshot":
                spec_fields["start_snapshot"] = self.snapshot(value, data, key)
            elif key == "actions":
                spec["actions"] = {"actions": self.field(value, _ACTIONS, key, data, key)}
            elif key == "workflow":
                if isinstance(value, list):
                    value = {"steps": value}
                    self.doc.remember(value, self.doc.line(data, key))
                spec["workflow"] = self.message(value, task_pb2.Workflow.DESCRIPTOR, key, data, key)
            elif key == "spec":
                spec.update(self.message(value, task_pb2.TaskSpec.DESCRIPTOR, key, data, key))
            elif key in _REQUEST_FIELDS:
                f = _REQUEST_FIELDS[key]
                out[f.name] = self.field(value, f, f.name, data, key)
            else:
                raise self.fail(data, key, None, "", _unknown_top_level(key))
        if len(spec) != 1:
            problem = "set actions or workflow, not both" if spec else "no actions or workflow"
            raise self.fail(data, None, data, "", problem)
        out["spec"] = {**spec, "apps": apps, **spec_fields} if apps else {**spec, **spec_fields}
        try:
            return json_format.ParseDict(out, scheduler_pb2.SubmitTaskRequest())
        except json_format.ParseError as exc:
            raise SpecError(self.doc.source, None, " ".join(str(exc).split())) from None

    def snapshot(self, value: Any, parent: Any, key: Hashable) -> str:
        """An emulator snapshot's name, as the emulator console takes it."""
        if not isinstance(value, str) or not SNAPSHOT_NAME.fullmatch(value):
            problem = "not a snapshot name: letters, digits, '.', '_', '-', at most 64"
            raise self.fail(parent, key, value, str(key), problem)
        return value

    def message(self, value: Any, desc: Descriptor, path: str, parent: Any, key: Hashable) -> Any:
        if desc.full_name == "google.protobuf.Duration":
            try:
                return parse_duration(value).ToJsonString()
            except ValueError as exc:
                raise self.fail(parent, key, value, path, str(exc)) from None
        if desc.full_name == "amc.v1.Action":
            return self.action(value, path, parent, key)
        value = self.shorthand(value, desc, path, parent, key)
        if not isinstance(value, dict):
            names = ", ".join(desc.fields_by_name)
            problem = f"expected a mapping of {names}, got {describe(value)}"
            raise self.fail(parent, key, value, path, problem)
        value = self.inline_selector(value, desc, path, parent, key)
        out: dict[str, Any] = {}
        for k, v in value.items():
            f = desc.fields_by_name.get(k) or desc.fields_by_camelcase_name.get(k)
            if f is None:
                known = list(desc.fields_by_name)
                has = ", ".join(known)
                problem = f"unknown field {k!r}; {suggest(k, known)}{desc.name} has {has}"
                raise self.fail(value, k, None, path, problem)
            out[f.name] = self.field(v, f, f"{path}.{f.name}", value, k)
        return out

    def shorthand(self, value: Any, desc: Descriptor, path: str, parent: Any, key: Hashable) -> Any:
        """`null` is `{}`; a lone value for a selector is its text."""
        if value is None:
            return {}
        if desc.full_name == "amc.v1.UiSelector" and not isinstance(value, dict | list):
            return self.made({"text": value}, parent, key, value)
        if desc.full_name == "amc.v1.InstallApp" and not isinstance(value, dict | list):
            return self.made({"app": value}, parent, key, value)
        return value

    def arguments(self, kind: str, value: Any, path: str, parent: Any, key: Hashable) -> Any:
        """An action's shorthands, from its fields in amc_common.action_table: a list gives the
        fields in order (at least those that must be given), a lone value the one field
        that must be given."""
        names = [f.name for f in FIELDS[kind]]
        required = sum(f.required for f in FIELDS[kind])
        if isinstance(value, list):
            if not names or not required <= len(value) <= len(names):
                raise self.fail(parent, key, value, path, _expected(names, required))
            return self.made(dict(zip(names, value, strict=False)), parent, key, value)
        if value is None or isinstance(value, dict):
            return value
        if required != 1:
            raise self.fail(parent, key, value, path, _expected(names, required))
        return self.made({names[0]: value}, parent, key, value)

    def made(self, out: dict[str, Any], parent: Any, key: Hashable, value: Any) -> dict[str, Any]:
        """`out`, written in the document as `value`: at its line."""
        self.doc.remember(out, self.doc.line(parent, key, value))
        return out

    def checked(
        self, action: dict[str, Any], path: str, parent: Any, key: Hashable, value: Any
    ) -> None:
        """The action against its definition: what the control plane would refuse is
        refused here, naming the same field."""
        try:
            from_message(json_format.ParseDict(action, task_pb2.Action()))
        except json_format.ParseError as exc:
            raise self.fail(parent, key, value, path, " ".join(str(exc).split())) from None
        except ActionError as exc:
            raise self.fail(parent, key, value, f"{path}.{exc.field}", exc.problem) from None

    def apps(self, value: Any, parent: Any, key: Hashable) -> list[Any]:
        """`apps:`: each a package, an app id, or install_app's mapping, checked as one."""
        apps: list[Any] = self.field(value, _APPS, "apps", parent, key)
        for i, one in enumerate(apps):
            try:
                from_message(json_format.ParseDict({"install_app": one}, task_pb2.Action()))
            except (json_format.ParseError, ActionError) as exc:
                inside = getattr(exc, "field", "").removeprefix("install_app").lstrip(".")
                problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
                path = f"apps[{i}].{inside}" if inside else f"apps[{i}]"
                raise self.fail(value, i, one, path, problem) from None
        return apps

    def inline_selector(
        self, value: dict[Any, Any], desc: Descriptor, path: str, parent: Any, key: Hashable
    ) -> dict[Any, Any]:
        """`tap_on: {text: OK}` means `tap_on: {selector: {text: OK}}`."""
        sel = desc.fields_by_name.get("selector")
        if sel is None or sel.message_type.full_name != "amc.v1.UiSelector":
            return value
        by = [k for k in value if k in sel.message_type.fields_by_name]
        if not by:
            return value
        if "selector" in value:
            problem = "give selector: or text/resource_id/content_desc, not both"
            raise self.fail(parent, key, value, path, problem)
        out = {k: v for k, v in value.items() if k not in by}
        out["selector"] = {k: value[k] for k in by}
        line = self.doc.line(parent, key, value)
        self.doc.remember(out, line)
        self.doc.remember(out["selector"], line)
        return out

    def action(self, value: Any, path: str, parent: Any, key: Hashable) -> dict[str, Any]:
        if isinstance(value, str) and value in _ACTION_KINDS:
            value = {value: None}  # `- screenshot`
        if not isinstance(value, dict):
            problem = f"an action is a mapping such as `tap: [10, 20]`, got {describe(value)}"
            raise self.fail(parent, key, value, path, problem)
        if len(value) != 1:
            found = ", ".join(map(str, value)) or "nothing"
            problem = f"an action has exactly one kind, found {found}"
            raise self.fail(parent, key, value, path, problem)
        ((kind, args),) = value.items()
        desc = task_pb2.Action.DESCRIPTOR
        f = desc.fields_by_name.get(kind) or desc.fields_by_camelcase_name.get(kind)
        if f is None:
            kinds = ", ".join(_ACTION_KINDS)
            problem = f"unknown action {kind!r}; {suggest(kind, _ACTION_KINDS)}expected {kinds}"
            raise self.fail(parent, key, value, path, problem)
        where = f"{path}.{f.name}"
        args = self.arguments(f.name, args, where, value, kind)
        action = {f.name: self.message(args, f.message_type, where, value, kind)}
        self.checked(action, path, parent, key, value)
        return action

    def field(self, value: Any, f: FieldDescriptor, path: str, parent: Any, key: Hashable) -> Any:
        if _is_map(f):
            if not isinstance(value, dict):
                raise self.fail(
                    parent, key, value, path, f"expected a mapping, got {describe(value)}"
                )
            vf = f.message_type.fields_by_name["value"]
            return {str(k): self.single(v, vf, f"{path}.{k}", value, k) for k, v in value.items()}
        if _repeated(f):
            if not isinstance(value, list):
                raise self.fail(parent, key, value, path, f"expected a list, got {describe(value)}")
            return [self.single(v, f, f"{path}[{i}]", value, i) for i, v in enumerate(value)]
        return self.single(value, f, path, parent, key)

    def single(self, value: Any, f: FieldDescriptor, path: str, parent: Any, key: Hashable) -> Any:
        if f.message_type is not None:
            return self.message(value, f.message_type, path, parent, key)
        try:
            return scalar(value, f)
        except ValueError as exc:
            raise self.fail(parent, key, value, path, str(exc)) from None


_ACTIONS = task_pb2.ActionList.DESCRIPTOR.fields_by_name["actions"]
_APPS = task_pb2.TaskSpec.DESCRIPTOR.fields_by_name["apps"]
_ACTION_KINDS = list(task_pb2.Action.DESCRIPTOR.fields_by_name)
_REQUEST_FIELDS = {
    name: f
    for names in (
        scheduler_pb2.SubmitTaskRequest.DESCRIPTOR.fields_by_name,
        scheduler_pb2.SubmitTaskRequest.DESCRIPTOR.fields_by_camelcase_name,
    )
    for name, f in names.items()
    if f.name != "spec"
}


def _expected(names: list[str], required: int) -> str:
    if not names:
        return "takes no arguments"
    shape = ", ".join(names[:required]) + (", ..." if len(names) > required else "")
    return f"expected a list [{shape}] or a mapping of {', '.join(names)}"


def _unknown_top_level(key: Any) -> str:
    hint = " (steps go under workflow:)" if key == "steps" else ""
    return f"unknown key {key!r}{hint}; {suggest(key, _TOP_LEVEL)}expected " + ", ".join(_TOP_LEVEL)
