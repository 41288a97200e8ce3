"""Checkpoint files: atomic publish, checksums, fallback past a corrupt newest one, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spotrun.elastic.checkpoint import files as checkpoint


def _save(value):
    return lambda path: torch.save({"value": value}, path)


def test_write_verify_load_round_trip(tmp_path: Path) -> None:
    manifest = checkpoint.write(tmp_path, 7, 3, _save(torch.arange(5)), samples_seen=84)
    assert manifest.step == 7 and manifest.world_size == 3 and manifest.samples_seen == 84
    assert checkpoint.verify(Path(manifest.path)) == manifest
    assert torch.equal(checkpoint.load_state(manifest)["value"], torch.arange(5))
    assert not list(tmp_path.glob(".tmp-*")), "the temp dir must be renamed away"


def test_existing_valid_step_is_kept(tmp_path: Path) -> None:
    first = checkpoint.write(tmp_path, 5, 2, _save(1))
    second = checkpoint.write(tmp_path, 5, 2, _save(2))
    assert second.sha256 == first.sha256
    assert checkpoint.load_state(second)["value"] == 1


def test_corrupt_or_partial_newest_falls_back_with_warning(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 10, 2, _save(10))
    newest = checkpoint.write(tmp_path, 20, 2, _save(20))
    Path(newest.path, checkpoint.STATE_FILE).write_bytes(b"garbage")
    (tmp_path / "step-000000030").mkdir()  # a partial checkpoint: no manifest
    warnings: list[str] = []
    found = checkpoint.newest_valid(tmp_path, warn=warnings.append)
    assert found is not None and found.step == 10
    assert len(warnings) == 2 and "step-000000030" in warnings[0] and "step-000000020" in warnings[1]


def test_manifest_mismatch_is_invalid(tmp_path: Path) -> None:
    manifest = checkpoint.write(tmp_path, 3, 1, _save(3))
    path = Path(manifest.path, checkpoint.MANIFEST_FILE)
    path.write_text(json.dumps({**json.loads(path.read_text()), "sha256": "0" * 64}))
    assert checkpoint.verify(Path(manifest.path)) is None
    assert checkpoint.newest_valid(tmp_path, warn=lambda _: None) is None


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        checkpoint.write(tmp_path, step, 1, _save(step))
    assert checkpoint.prune(tmp_path, keep=2) == [2, 1]
    assert checkpoint.steps(tmp_path) == [4, 3]
