"""Elastic training runtime: etcd v3 rendezvous for torchrun, the pre-warmed launcher, trainer helpers.

Also the file conventions shared by the agent's side (spotrun.node.supervisor, no torch) and the
launcher's and workers' side; this module imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

# A worker that exits because a peer died touches this file (ElasticTrainer); the launcher's
# rendezvous handler reports it as it re-joins (see spotrun.elastic.rendezvous).
PEER_LOST_FILE_ENV = "SPOTRUN_PEER_LOST_FILE"


def served_path(control_file: Path) -> Path:
    """Where the seq of the newest "checkpoint now" request acted upon is kept, beside the control file."""
    return control_file.with_name(control_file.name + ".served")
