"""A free TCP port on loopback, for the process groups and Ray heads tests start."""
from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port the OS just gave and took back: free unless another process takes it first
    (the tests that use it start their group at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
