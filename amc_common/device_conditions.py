"""A device's conditions as the API, the database and people spell them
(amc.v1.DeviceCondition without its DEVICE_CONDITION_ prefix, in lower case).

A host's probes judge each phone to be in one (`cleaning`: its host cleans it between
leases); only a `ready` phone takes work. Both programs' metrics and the control plane's
gauges count devices by them. The wire's enum, host_agent.health's `Condition` and the
schema's CHECK are held to this list by tests/test_shared_names.py.
"""

from __future__ import annotations

CONDITIONS = (
    "ready",
    "charging_hold",
    "too_hot",
    "unresponsive",
    "booting",
    "recovering",
    "quarantined",
    "offline",
    "low_storage",
    "cleaning",
)
