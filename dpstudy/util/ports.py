"""A free TCP port for a rendezvous (torchrun's c10d store, a test's process group)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS had free a moment ago; another process may still take it before we bind."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
