"""Test doubles for the edges we cannot have in CI: phones and the adb server."""
