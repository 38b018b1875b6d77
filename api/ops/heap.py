"""Freezing what a long-lived process built at start-up, for the API and the dispatcher alike."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Move what the process holds once it is up (modules, settings, routes, pydantic schemas, the
    engine) out of the garbage collector's reach (`gc.freeze`, Python's documented use of it). Those
    objects live as long as the process and are never freed, yet every full collection would walk
    all of them again; frozen, a collection walks only what later requests and rounds allocate
    (bench/README.md has the figures for both processes).

    Call it once, after start-up and in a process that serves, not inside `create_app`: a test
    process builds many apps, and frozen objects are never freed."""
    gc.collect()
    gc.freeze()
