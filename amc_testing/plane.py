"""The control plane in-process, for the harnesses (see the package's docstring)."""

from control_plane.config import Settings
from control_plane.server import ControlPlane
from control_plane.store import migrate

__all__ = ["ControlPlane", "Settings", "migrate"]
