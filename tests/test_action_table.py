"""The action table (amc_common.action_table) against the proto, and the three programs that
read it against each other: for every field of every action, a value at its limit is
accepted by the control plane, the host agent and the CLI alike, one past it refused by
all three naming the field, and a field left out has the same default everywhere."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.errors import SpecError
from amc_cli.specfile import load_request
from amc_common.action_limits import DevicePath, Digest, Switch
from amc_common.action_table import (
    ACTIONS,
    FIELDS,
    MAX_STRING,
    Field,
    Seconds,
    Selector,
    Text,
    UiSelector,
    Whole,
)
from host_agent.spec import ActionList, InvalidSpec
from host_agent.wire import spec_from_proto
from tests.support import Farm, actions_spec

ONEOF = task_pb2.Action.DESCRIPTOR.oneofs_by_name["kind"]
_SCALARS = {
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
}
# The actions that name an app or a file of the library: a value their definition accepts
# is then looked up in the library, which the farm of this test leaves empty (NOT_FOUND).
_LIBRARY = ("install_app", "push_file")


def _proto_type(f: FieldDescriptor) -> str:
    if f.message_type is not None:
        return str(f.message_type.full_name)
    return _SCALARS.get(f.type, f"type {f.type}")


def test_the_table_has_every_member_of_the_action_oneof_in_its_order() -> None:
    """THEN no action is interpreted without a definition, and none is defined that the
    wire cannot carry."""
    assert list(ACTIONS) == [f.name for f in ONEOF.fields]


@pytest.mark.parametrize("kind", list(ACTIONS))
def test_each_action_has_the_fields_of_its_message_with_their_types(kind: str) -> None:
    """THEN the class is named after the message, with its fields in its order (the CLI's
    list shorthand relies on it), each limit reading the field's own proto type."""
    message = task_pb2.Action.DESCRIPTOR.fields_by_name[kind].message_type
    assert ACTIONS[kind].__name__ == message.name
    assert [f.name for f in FIELDS[kind]] == [f.name for f in message.fields]
    for ours, theirs in zip(FIELDS[kind], message.fields, strict=True):
        assert ours.limit.proto == _proto_type(theirs), (kind, ours.name)


# -- the edges of every field ---------------------------------------------------------------

OMIT = object()


@dataclass(frozen=True)
class Case:
    """One field of one action set to `written` (as a spec file writes it; OMIT: left out):
    accepted everywhere with `value` as what the host runs, or refused everywhere."""

    kind: str
    field: str
    written: object
    value: object
    ok: bool

    def action(self) -> dict[str, object]:
        args = {f.name: _sample(f) for f in FIELDS[self.kind] if f.required}
        args.pop(self.field, None)
        if self.written is not OMIT:
            args[self.field] = self.written
        return {self.kind: args}

    def __str__(self) -> str:
        shown = "left out" if self.written is OMIT else f"{self.written!r:.40}"
        return f"{self.kind}.{self.field} {shown} ({'accepted' if self.ok else 'refused'})"


def _sample(f: Field) -> object:
    """A value every program accepts, for the fields a case does not test."""
    match f.limit:
        case Whole(low=low):
            return low
        case Text(pattern=pattern):
            return "com.example.app" if pattern else "x"
        case Seconds():
            return "1s"
        case Selector():
            return {"text": "OK"}
        case Switch():
            return False
        case Digest():
            return "0" * 64
        case DevicePath():
            return "/sdcard/x"
    raise AssertionError(f"no sample for {f.limit}")


def _edges(f: Field) -> Iterator[tuple[object, object, bool]]:
    """(as written, as run, accepted?) at and just past the field's limits."""
    match f.limit:
        case Whole(low=low, high=high):
            yield from ((low, low, True), (high, high, True))
            yield from ((low - 1, None, False), (high + 1, None, False))
        case Text(limit=limit, required=required, pattern=pattern):
            longest = "com.example.".ljust(limit, "a") if pattern else "x" * limit
            yield longest, longest, True
            yield longest + "a", None, False
            yield "a\x00b", None, False
            if required:
                yield "", None, False
        case Seconds(high=high, positive=positive):
            shortest = "0.000000001s" if positive else "0s"
            yield shortest, 1e-9 if positive else 0.0, True
            yield f"{high:g}s", float(high), True
            yield f"{high:g}.000000001s", None, False
            if positive:
                yield "0s", None, False
        case Selector():
            longest = "x" * MAX_STRING
            yield {"text": longest}, UiSelector(text=longest), True
            yield {"content_desc": longest + "x"}, None, False
            yield {"resource_id": ""}, None, False
            yield {}, None, False
        case Switch():
            yield from ((True, True, True), (False, False, True))
        case Digest():
            yield "a" * 64, "a" * 64, True
            yield from (("a" * 63, None, False), ("A" * 64, None, False), ("", None, False))
        case DevicePath(limit=limit):
            longest = "/sdcard/".ljust(limit, "a")
            yield longest, longest, True
            yield longest + "a", None, False
            yield from (("/etc/passwd", None, False), ("/sdcard/../x", None, False))
            yield from (("/sdcard/a\x00b", None, False), ("", None, False))
        case _:
            raise AssertionError(f"no edges for {f.limit}")


def cases(kind: str) -> list[Case]:
    out = []
    for f in FIELDS[kind]:
        out += [Case(kind, f.name, w, v, ok) for w, v, ok in _edges(f)]
        if isinstance(f.limit, Whole):  # no presence on the wire: left out, it reads as 0
            out.append(Case(kind, f.name, OMIT, 0, f.limit.low <= 0 <= f.limit.high))
        else:  # the table's default, or refused if it has none
            out.append(Case(kind, f.name, OMIT, f.default, not f.required))
    return out


def _names(message: str, path: str) -> bool:
    """Whether the message is about the field at `path` (or a field inside it)."""
    return re.match(rf"{re.escape(path)}[.:]", message) is not None


async def _server(farm: Farm, pb: task_pb2.Action, case: Case) -> str | None:
    """None if the control plane took the task; else the problem it answered, which must
    be INVALID_ARGUMENT."""
    client = await farm.client()
    try:
        await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(pb)))
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND and case.kind in _LIBRARY:
            return None  # its definition took it; the (empty) library has no such app

        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (str(case), err.details())
        return (err.details() or "").removeprefix("spec.actions.actions[0].")
    return None


def _cli(tmp_path: Path, case: Case) -> scheduler_pb2.SubmitTaskRequest | str:
    """The request the CLI builds from a spec file holding the action, or its one line."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"actions": [case.action()]}))
    try:
        return load_request(str(path))
    except SpecError as err:
        line = str(err)
        assert "\n" not in line, line
        return line.removeprefix(f"{path}:").split(" ", 1)[1].removeprefix("actions[0].")


def _host(pb: task_pb2.Action) -> object:
    """The action the host agent would run, or its InvalidSpec message."""
    try:
        spec = spec_from_proto(actions_spec(pb))
    except InvalidSpec as err:
        return str(err).removeprefix("action 1: ")
    assert isinstance(spec, ActionList)
    return spec.actions[0]


@pytest.mark.parametrize("kind", list(ACTIONS))
async def test_the_server_the_host_and_the_cli_agree_on_every_limit_and_default(
    kind: str, farm: Farm, tmp_path: Path
) -> None:
    """THEN each value at a limit is accepted by all three (the host running what was
    written), each past it refused by all three naming the field (INVALID_ARGUMENT from the
    server, one line from the CLI), and a field left out runs with the table's default."""
    wrong = []
    for case in cases(kind):
        path = f"{kind}.{case.field}"
        pb = json_format.ParseDict(case.action(), task_pb2.Action())
        server, cli, host = await _server(farm, pb, case), _cli(tmp_path, case), _host(pb)
        if case.ok:
            ran = getattr(host, case.field, host)
            if server is not None or isinstance(cli, str) or ran != case.value:
                wrong.append(f"{case}: server {server!r}, cli {cli!r}, host ran {ran!r}")
            elif cli.spec.actions.actions[0] != pb:
                wrong.append(f"{case}: the CLI sent {cli.spec.actions.actions[0]}")
        elif not all(isinstance(m, str) and _names(m, path) for m in (server, cli, host)):
            said = cli if isinstance(cli, str) else "accepted"
            wrong.append(f"{case}: server {server!r}, cli {said!r}, host {host!r}")
    assert not wrong, "\n".join(wrong)
