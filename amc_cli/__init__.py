"""`amc`: the operator and client command line for Agentic Mobile Control.

__main__           entry point: runs the app, turns every failure into one line and an exit code
app                the root command: connection flags, --version; adds the command groups
commands/          the commands, a typer app per group: tasks, logs, agents, adb, tokens,
                   hosts, devices, queue, apps (and files)
options            what the commands share: the connection, --output, --reason, KEY=VALUE flags
client             a synchronous gRPC client with the bearer token on every call
specfile           task-spec files (YAML/JSON) -> SubmitTaskRequest, walked beside the messages
specdoc            reading a spec file: JSON or YAML, the line of each part, no duplicate keys
specvalues         a spec's single values as their fields want them; key names (amc_common.keycodes)
selectors          warnings for a selector no registered device fits (submit; --strict)
follow             following a task until it ends (watch, submit --wait)
adb_session        amc adb from start to end: the port, the session, the door, the exit code
adb_door           amc adb's door: the port the adb client connects to, its transports
adb_link           the door's Scheduler.AdbStreams call: the phone, its streams carried
artifact_download  a task's kept file: which one a step names, written out checked
library            the app library: a file checked and uploaded, an app by id or package
render             what all output shares: the console, JSON documents, small values, notes
render_tasks       a task for people: detail, history, list, watch lines, kept files
render_hosts       hosts, devices and tokens for people
render_queue       the queue and fairness keys for people
errors             the CLI's error types and the exit-code table
diagnose           one line for a TLS or connection mistake, naming the flag that fixes it
"""
