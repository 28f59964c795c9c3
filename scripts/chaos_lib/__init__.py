"""The pieces of `scripts/chaos.py`: processes, proxies, workload, faults, and the checks."""
