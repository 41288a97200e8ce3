"""Local VMs need no credentials: nothing to find, nothing to ship to a head VM."""

from __future__ import annotations


def head_env(secrets_dir: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """(environment, files) a head VM's controller needs to call this provider: none."""
    del secrets_dir  # nothing to ship
    return {}, {}
