"""The operator console: a browser UI the control plane serves itself (see .http)."""
