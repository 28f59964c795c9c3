"""The pieces of `scripts/bench.py` (`make bench`), one module per concern.

stack      embedded PostgreSQL, control plane and host agents as processes; their CPU/RSS
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
report     the table, the targets and bench-results.json
"""
