"""A free TCP port: for the local stack's servers (loopback) and for a gang's rendezvous (every
interface, so that the other nodes reach it). Here because both the control plane and the workers
use it, and they share only this package."""

from __future__ import annotations

import socket


def free_port(preferred: int = 0, host: str = "127.0.0.1") -> int:
    """`preferred` when it is free on `host` ("" for every interface), else any free port. Free when
    asked: another process may still take it before it is bound again."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port on {host or 'any interface'}")
