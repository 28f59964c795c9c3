"""PostgreSQL for the harnesses (see the package's docstring)."""

from control_plane.embedded import EmbeddedPostgres, ReplicatedPostgres, free_port
from control_plane.embedded import binary as postgres_binary

__all__ = ["EmbeddedPostgres", "ReplicatedPostgres", "free_port", "postgres_binary"]
