"""Which adb services an adb door opens on a leased phone, and for whom: one judgement for
the control plane (by the caller's role) and the phone's host (the floor it keeps whoever
asks).

A door carries what an adb client asks of a phone (`shell:`, `exec:`, `sync:` for push and
pull, `tcp:` and `localabstract:` for `adb forward`, `jdwp:`, `framebuffer:`, …). Never,
for anyone:

* the adb server's own services (`host:…`, `host-serial:…`): on the host they would reach
  its adb server, so other phones (the host opens `host:transport:` itself, fixed to the
  leased serial);
* `reverse:` (`adb reverse`): the phone's connections would reach the farm's host, not
  the client's machine.

For operators only, since they change the phone past its lease or drop it off its host
for a while (what a cleaning between leases does not undo, or a reboot the host sees as a
lost phone): `root:`, `unroot:`, `remount:`, `reboot:…`, `disable-verity:`,
`enable-verity:`, `tcpip:`, `usb:`, `reconnect`, `sideload:`, `sideload-host:`.

What a service's own command does is the phone's business: `shell:reboot` runs as the
phone's shell user, as on a USB phone; its host then sees the phone go and comes back to
it as to any lost phone.
"""

from __future__ import annotations

# The longest service name a door carries (adb's own limit for an OPEN).
MOST_CHARS = 4096
NEVER = ("host:", "host-serial:", "host-usb:", "host-local:", "host-transport-id:", "reverse:")
OPERATORS_ONLY = (
    "root:",
    "unroot:",
    "remount",
    "reboot",
    "disable-verity",
    "enable-verity",
    "tcpip:",
    "usb:",
    "reconnect",
    "sideload",
)


def refusal(service: str, *, operator: bool) -> str | None:
    """Why a door does not open `service` for this caller, in one line; None: it does."""
    floor = never(service)
    if floor is not None or operator:
        return floor
    if service.startswith(OPERATORS_ONLY):
        name = service.split(":", 1)[0]
        return (
            f"amc: {name} is for operators: it would change the phone past this lease"
            " (a client's door does not carry it)"
        )
    return None


def never(service: str) -> str | None:
    """Why no door opens `service`, whoever asks (the host's floor); None: it may."""
    if not service or len(service) > MOST_CHARS or "\0" in service:
        return f"amc: not an adb service: {service[:80]!r}"
    if service.startswith("reverse:"):
        return (
            "amc: adb reverse is not carried: the phone's connections would reach the"
            " farm's host, not your machine"
        )
    if service.startswith(NEVER):
        return f"amc: {service.split(':', 1)[0]} is the adb server's, not the phone's"
    return None
