"""The `amc` commands, one module per group, each a Typer app that amc_cli.app adds to the
root command (tasks, logs, agents and adb without a name: their commands sit at the top
level).

tasks     submit, get, list, cancel, watch; artifacts, artifact
logs      a task's phone log (amc logs TASK --follow)
agents    mcp
adb       adb (a phone on a local port for the adb client)
tokens    amc tokens create, list, revoke
hosts     amc hosts; cordon, uncordon, drain, show, remove
devices   amc devices cordon, uncordon, release
queue     amc queue; set, show
"""
