"""Random task specs for the workload: mostly workflows of named steps, some action lists.

Every spec ends with a step that touches the device, so "cancel just before the last step"
has a boundary to aim at (screenshots and UI dumps among the actions: their files are
uploaded as artifacts before each report); a few fail on purpose (a shell command exiting
1), some take several lease renewals (a long wait), and step timings vary with random
waits. Half the shell actions install a package (and leave its file), for the clean after
the lease to remove.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from google.protobuf import duration_pb2

from amc.v1 import task_pb2

# The action kinds that reach the (simulated) phone and so are in the action logs.
DEVICE_KINDS = frozenset(
    {
        "tap",
        "swipe",
        "input_text",
        "key",
        "launch_app",
        "stop_app",
        "shell",
        "screenshot",
        "ui_dump",
    }
)


@dataclass(frozen=True)
class Plan:
    spec: task_pb2.TaskSpec
    # Device actions before the last step starts: "before the last step" is when that many
    # have been logged for the attempt.
    device_actions_before_last: int
    device_actions: int
    fails_on_purpose: bool
    long: bool


def _seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=value))
    return d


def _device_action(rng: random.Random) -> task_pb2.Action:
    kind = rng.choice(sorted(DEVICE_KINDS))
    a = task_pb2.Action
    match kind:
        case "tap":
            return a(tap=task_pb2.Tap(x=rng.randrange(1080), y=rng.randrange(2400)))
        case "swipe":
            return a(swipe=task_pb2.Swipe(x1=500, y1=1800, x2=500, y2=600, duration=_seconds(0.2)))
        case "input_text":
            return a(input_text=task_pb2.InputText(text=f"chaos-{rng.randrange(10**6)}"))
        case "key":
            return a(key=task_pb2.Key(keycode=rng.choice([3, 4, 61, 66])))
        case "launch_app":
            return a(launch_app=task_pb2.LaunchApp(package="com.amc.simulated"))
        case "stop_app":
            return a(stop_app=task_pb2.StopApp(package="com.amc.simulated"))
        case "shell" if rng.random() < 0.5:
            # Leaves a package and a file for the clean after the lease to remove.
            apk = f"/data/local/tmp/com.chaos.left{rng.randrange(5)}.apk"
            return a(shell=task_pb2.Shell(command=f"touch {apk} && pm install -r {apk}"))
        case "shell":
            return a(shell=task_pb2.Shell(command=f"echo {rng.randrange(10**6)}"))
        case "ui_dump":
            return a(ui_dump=task_pb2.UiDump())
        case _:
            return a(screenshot=task_pb2.Screenshot())


def _wait(seconds: float) -> task_pb2.Action:
    return task_pb2.Action(wait=task_pb2.Wait(duration=_seconds(seconds)))


def _step_actions(rng: random.Random) -> list[task_pb2.Action]:
    actions = [_device_action(rng) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.4:
        actions.insert(rng.randrange(len(actions) + 1), _wait(rng.uniform(0.05, 0.6)))
    return actions


def random_plan(rng: random.Random) -> Plan:
    steps = [_step_actions(rng) for _ in range(rng.randint(2, 5))]
    long = rng.random() < 0.12
    if long:  # spans a few renewals: a lease that must be kept alive, or lost, mid-run
        steps[rng.randrange(len(steps) - 1)].append(_wait(rng.uniform(2.0, 5.0)))
    fails = rng.random() < 0.07
    if fails:
        failing = task_pb2.Action(shell=task_pb2.Shell(command="false"))
        steps[rng.randrange(len(steps) - 1)].append(failing)
    if not any(a.WhichOneof("kind") in DEVICE_KINDS for a in steps[-1]):
        steps[-1].append(_device_action(rng))
    counts = [sum(a.WhichOneof("kind") in DEVICE_KINDS for a in s) for s in steps]
    if rng.random() < 0.2 and not fails:
        # An action list (TaskRunner): every action is a step of its own.
        flat = [a for s in steps for a in s]
        spec = task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=flat))
        before_last = sum(counts) - 1
    else:
        workflow = task_pb2.Workflow(
            steps=[
                task_pb2.WorkflowStep(name=f"step-{i}", actions=acts)
                for i, acts in enumerate(steps)
            ]
        )
        spec = task_pb2.TaskSpec(workflow=workflow)
        before_last = sum(counts[:-1])
    return Plan(spec, before_last, sum(counts), fails, long)
