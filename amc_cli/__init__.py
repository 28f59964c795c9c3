"""`amc`: the operator and client command line for Agentic Mobile Control.

__main__   entry point: runs the app, turns every failure into one line and an exit code
app        the commands (typer); each parses its flags, calls `client`, hands to `render`
client     a synchronous gRPC client with the bearer token on every call
specfile   task-spec files (YAML/JSON) -> SubmitTaskRequest
selectors  warnings for a selector no registered device fits (submit; --strict)
follow     following a task until it ends (watch, submit --wait)
artifacts  a task's kept files: which one a step names, writing one out checked
render     human tables (rich) and JSON documents
errors     the CLI's error types and the exit-code table
diagnose   one line for a TLS or connection mistake, naming the flag that fixes it
"""
