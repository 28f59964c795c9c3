"""`amc artifacts` and `amc artifact`: a task's kept files (screenshots, UI dumps), which
one a STEP names, and writing one to a file or stdout with its sha256 checked."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from amc.v1 import task_pb2
from amc_cli.errors import BadInput, CliError, ExitCode
from amc_common.steps import index_of
from amc_common.steps import label as step_label
from amc_common.steps import number as step_number

# What a run keeps with its last step besides its actions' files: its screen recording
# and its phone's log. A step named without --action means its actions' file, if it has one.
RUN_FILES = frozenset({"screen_recording", "logcat"})


def choose(
    artifacts: list[task_pb2.Artifact],
    task_id: str,
    step: str,
    attempt: int | None,
    action: int | None,
) -> task_pb2.Artifact:
    """The one artifact `step` (a step's number, from 1, or its name) names: of `attempt`
    (default: the latest attempt that kept one there) and `action` (its place in the step,
    from 1: needed when the step kept several; without it, the run's recording and log
    kept with the last step yield to its actions' file)."""
    matching = [a for a in artifacts if _step_is(a, step)]
    if attempt is not None:
        matching = [a for a in matching if a.attempt == attempt]
    elif matching:
        latest = max(a.attempt for a in matching)
        matching = [a for a in matching if a.attempt == latest]
    if action is not None:
        matching = [a for a in matching if step_number(a.action_index) == action]
    elif len(matching) > 1 and any(a.kind not in RUN_FILES for a in matching):
        matching = [a for a in matching if a.kind not in RUN_FILES]
    if not matching:
        kept = ", ".join(
            step_label(i, name)
            for i, name in sorted({(a.step_index, a.step_name) for a in artifacts})
        )
        where = f"; steps with artifacts: {kept}" if kept else "; it has none"
        raise CliError(
            f"task {task_id} has no artifact for step {step!r}{where}", ExitCode.NOT_FOUND
        )
    if len(matching) > 1:
        which = ", ".join(f"--action {step_number(a.action_index)} ({a.kind})" for a in matching)
        raise BadInput(f"step {step!r} kept {len(matching)} artifacts; choose one: {which}")
    return matching[0]


def _step_is(artifact: task_pb2.Artifact, step: str) -> bool:
    return step == artifact.step_name or index_of(step) == artifact.step_index


def write(artifact: task_pb2.Artifact, chunks: Iterator[bytes], target: str) -> int:
    """Write the bytes to `target` ("-": stdout), checking their size and sha256; a file
    is written beside its place and renamed, so a failed download leaves nothing. Returns
    the size."""
    if target == "-":
        return _copy(artifact, chunks, sys.stdout.buffer)
    path = Path(target)
    try:
        fd, temp = _beside(path)
    except OSError as exc:
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            size = _copy(artifact, chunks, out)
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return size


def _beside(path: Path) -> tuple[int, str]:
    """A new file of a name of its own beside `path`, open for writing, with the mode any
    new file of the user gets (0666 less the umask; tempfile's would be 0600)."""
    for _ in range(100):
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(temp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name for a temporary file", str(path.parent))


def _copy(artifact: task_pb2.Artifact, chunks: Iterator[bytes], out: BinaryIO) -> int:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        out.write(chunk)
    out.flush()
    if size != artifact.size_bytes or digest.hexdigest() != artifact.sha256:
        raise CliError(
            f"artifact {artifact.artifact_id} arrived damaged: {size} bytes, sha256"
            f" {digest.hexdigest()}; expected {artifact.size_bytes} bytes, sha256 {artifact.sha256}"
        )
    return size
