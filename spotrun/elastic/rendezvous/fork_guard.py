"""Forked workers must never use the launcher's etcd connection: gRPC is not fork-safe.

An at-fork hook, registered when this module is imported (in the launcher, before any worker is
forked), marks a forked child; after that every etcd call of the rendezvous raises at once
instead of hanging in gRPC.
"""

from __future__ import annotations

import os

_in_forked_child = False


def _after_fork_in_child() -> None:
    global _in_forked_child
    _in_forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def in_forked_child() -> bool:
    """True in a process forked from the one that imported this module."""
    return _in_forked_child


def check_not_forked() -> None:
    """Raises RuntimeError in a forked child (call before any etcd call)."""
    if _in_forked_child:
        raise RuntimeError("a forked worker must not use the launcher's etcd connection (gRPC is not fork-safe)")
