"""Sharded (DCP) checkpoints on object storage against moto's S3 server: multipart shards, a writer
killed mid-upload, a corrupt shard, pruning, and the trainer (FSDP) resuming at another world size
from a bucket. The world 3 -> 2 and 4 round trip is test_sharded_checkpoint.py's, on S3 too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("moto.server")
pytest.importorskip("libcloud")
torch = pytest.importorskip("torch")

from spotrun.providers.storage import open_store  # noqa: E402  (after the skips above)
from test_remote_checkpoint import HANG_AFTER_TWO_PARTS, PART, _big_state, _objects, kill_mid_upload  # noqa: E402
from test_trainer import Group  # noqa: E402

from spotrun.elastic.checkpoint import files, remote, remote_sharded  # noqa: E402
from spotrun.node.protocol import ControlCommand, ControlWriter, ExitCode  # noqa: E402


def _shard(manifest: files.ShardedManifest) -> str:
    (name,) = (name for name in manifest.files if name.endswith(".distcp"))
    return name


def test_a_large_shard_goes_up_in_parts_hashed_as_written_and_loads_back(
    url: str, small_parts: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_back(path: Path) -> str:
        raise AssertionError(f"{path} was read back to hash it")

    with monkeypatch.context() as patched:  # a save hashes what it writes, never what it wrote
        patched.setattr(remote, "sha256", read_back)
        patched.setattr(files, "sha256", read_back)
        manifest = remote_sharded.save_alone(url, 5, 1, _big_state(5), 60)
    assert isinstance(manifest, files.ShardedManifest) and manifest.path == f"{url}/step-000000005"
    assert manifest.step == 5 and manifest.samples_seen == 60
    writer_dirs = {name.split("/")[0] for name in manifest.files}
    assert len(writer_dirs) == 1 and writer_dirs.pop().startswith("shards-")
    store, prefix = open_store(url)
    shard = store.driver.get_object(store.bucket, f"{prefix}/step-000000005/{_shard(manifest)}")
    assert shard.size > 2 * PART and shard.hash.endswith("-3")  # S3's ETag of an object completed from 3 parts
    assert store.pending_uploads(prefix + "/") == []
    assert remote.published(url, 5) == manifest
    assert remote_sharded.save_alone(url, 5, 1, {"w": torch.zeros(3)}, 60) == manifest, "a published step is kept"

    found = remote.newest_valid(url)
    assert found == manifest
    loaded = {"w": torch.zeros(3_150_000), "seed": 0}
    remote_sharded.load(found, loaded)
    assert torch.equal(loaded["w"], _big_state(5)["w"]) and loaded["seed"] == 5
    with pytest.raises(ValueError, match="sharded"):
        remote.load_state(found)


KILLED_WRITER = (
    HANG_AFTER_TWO_PARTS
    + """
from spotrun.elastic.checkpoint import remote_sharded
remote_sharded.save_alone(sys.argv[1], 20, 2, state, 240)
"""
)


def test_writer_killed_mid_upload_leaves_no_checkpoint_and_the_next_save_cleans_up(
    url: str, env: dict[str, str], small_parts: dict[str, str], tmp_path: Path
) -> None:
    older = remote_sharded.save_alone(url, 10, 2, {"w": torch.arange(4.0)}, 120)
    kill_mid_upload(KILLED_WRITER, url, env, small_parts, tmp_path)  # in the upload of its shard
    store, prefix = open_store(url)
    (upload,) = store.pending_uploads(prefix + "/")
    assert upload.name.startswith(f"{prefix}/step-000000020/shards-")
    assert remote.verify(f"{url}/step-000000020") is None and remote.published(url, 20) is None
    assert remote.newest_valid(url, warn=lambda _: None) == older

    newer = remote_sharded.save_alone(url, 30, 2, _big_state(30), 360)
    assert store.pending_uploads(prefix + "/") == []  # the dead writer's parts are freed
    found = remote.newest_valid(url)
    assert found == newer
    loaded = {"w": torch.zeros(3_150_000), "seed": 0}
    remote_sharded.load(found, loaded)
    assert torch.equal(loaded["w"], _big_state(30)["w"])


def test_a_corrupt_or_partial_step_is_skipped_with_a_warning_and_prune_keeps_k_valid(url: str, tmp_path: Path) -> None:
    saved = {
        step: remote_sharded.save_alone(url, step, 1, {"w": torch.arange(6.0) + step}, 12 * step)
        for step in (1, 2, 3, 4)
    }
    store, prefix = open_store(url)
    shard_key = f"{prefix}/step-000000004/{_shard(saved[4])}"
    flipped = tmp_path / "flipped"
    assert store.download(shard_key, flipped)
    flipped.write_bytes(bytes(b ^ 0xFF for b in flipped.read_bytes()))  # same size, other bytes
    store.put_file(shard_key, flipped)
    store.put_file(f"{prefix}/step-000000005/shards-deadbeef0000/__0_0.distcp", flipped)  # died before its manifest
    warnings: list[str] = []
    found = remote.newest_valid(url, warn=warnings.append)
    assert found == saved[3]
    assert len(warnings) == 2 and "step-000000005" in warnings[0] and "step-000000004" in warnings[1]
    loaded = {"w": torch.zeros(6)}
    remote_sharded.load(found, loaded)
    assert torch.equal(loaded["w"], torch.arange(6.0) + 3)

    torn = tmp_path / "torn"
    torn.write_bytes(b"torn")
    store.put_file(shard_key, torn)  # step 4's shard no longer has its size: it is broken even to prune
    # Step 5 has no manifest and is newer than every whole step: its writer may still be at work.
    assert remote.prune(url, keep=2) == [4, 1], "a broken checkpoint does not count towards keep"
    assert remote.steps(url) == [5, 3, 2]
    assert remote.newest_valid(url, warn=lambda _: None) == saved[3]
    remote_sharded.save_alone(url, 6, 1, {"w": torch.arange(6.0) + 6}, 72)
    assert remote.prune(url, keep=2) == [5, 2]
    assert {name.split("/")[0] for name in _objects(url)} == {"step-000000006", "step-000000003"}


OLD_STATE = """
import sys, torch
from torch import nn
from spotrun.elastic.checkpoint import remote
torch.manual_seed(0)
model = nn.Linear(4, 1)  # tests/trainer_scripts/steps.py's DDP model and optimizer
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7, "samples_seen": 84,
         "world_size": 2}
remote.write(sys.argv[1], 7, 2, lambda path: torch.save(state, path), samples_seen=84)
"""


@pytest.mark.slow
def test_trainer_resumes_from_a_single_state_checkpoint_of_an_earlier_version(
    url: str, env: dict[str, str], tmp_path: Path
) -> None:
    wrote = subprocess.run([sys.executable, "-c", OLD_STATE, url], capture_output=True, text=True, timeout=120)
    assert wrote.returncode == 0, wrote.stderr
    group = Group(tmp_path, 1, 10, "old", location=url)
    assert group.wait() == [0], group.logs[0].read_text()
    assert group.steps(0) == [8, 9, 10]
    assert "resumed from step 7" in group.logs[0].read_text()
    final = remote.newest_valid(url)
    assert isinstance(final, files.ShardedManifest) and final.step == 10


@pytest.mark.slow
def test_fsdp_trainer_checkpoints_to_s3_and_resumes_at_another_world_size(
    url: str, env: dict[str, str], tmp_path: Path
) -> None:
    first = Group(tmp_path, 3, 40, "first", location=url, args=("--parallel", "fsdp"))
    first.wait_for_step(10)
    ControlWriter(first.controls[1]).request(ControlCommand.LEAVE, "node-1")
    assert first.wait() == [ExitCode.REFORM] * 3, first.logs[0].read_text()
    done = {first.steps(r)[-1] for r in range(3)}
    assert len(done) == 1, f"ranks stopped at different steps: {done}"
    (step,) = done
    manifest = remote.newest_valid(url)
    assert isinstance(manifest, files.ShardedManifest) and manifest.step == step and manifest.world_size == 3
    assert {f"__{rank}_0.distcp" for rank in range(3)} <= {name.split("/")[-1] for name in manifest.files}

    second = Group(tmp_path, 2, 40, "second", location=url, args=("--parallel", "fsdp"))
    assert second.wait() == [0, 0], second.logs[0].read_text()
    assert second.steps(0)[0] == step + 1, "resumed at the wrong step"
    assert first.steps(0) + second.steps(0) == list(range(1, 41)), "a step ran twice or was skipped"
    assert f"resumed from step {step} (saved at world size 3, now 2)" in second.logs[0].read_text()
    final = remote.newest_valid(url)
    assert final is not None and final.step == 40 and final.world_size == 2
    assert not [name for name in _objects(url) if "/state-" in name], "every checkpoint is sharded"
