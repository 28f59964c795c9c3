"""The pieces of `scripts/bench.py` (`make bench`), one module per concern.

options    the flags, the sizes they come to, and the run's plan (printed at the start)
stack      embedded PostgreSQL, control plane and host agents as processes; their CPU/RSS,
           and CPU per unit of work
client     gRPC stubs and the task specs the workloads submit
pgstats    cluster counters (commits, WAL) and the database checks of a run
promtext   the control plane's Prometheus metrics: scrape, histogram deltas, quantiles
stats      min / median / p99 / max summaries
lifecycle  workload 1: drain N tasks through 4 agents x 25 simulated devices
latency    workloads 2 and 3: pickup and cancel latency
renewal    workload 4: renewal capacity (renew_load.py is its load-client process)
ceiling    workload 5: pgbench single-row UPDATE TPS on the same server
peer       workload 6: ../shared/bench/peers/run-pgqueuer in the same run
fleet      workload 7: N hosts x 4 devices, pickup / CPU / RSS per host (issue 10);
           fleet_load.py is its load-client process, fleet_host.py one host's behaviour
deep       workload 8: the fleet load on a database with a backlog and a history
flood      workload 9: one team floods the phones, another submits now and then
session    workload 10: interactive sessions; screen: workload 11, live screens
report     the table, the targets and bench-results.json
"""
