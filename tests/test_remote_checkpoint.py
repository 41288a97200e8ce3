"""Checkpoints on object storage against moto's S3 server on loopback, through libcloud's S3 driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("moto.server")
pytest.importorskip("libcloud")
torch = pytest.importorskip("torch")

from spotrun.providers.storage import open_store  # noqa: E402  (after the skips above)

from spotrun.elastic.checkpoint import files as checkpoint  # noqa: E402
from spotrun.elastic.checkpoint import remote as remote_checkpoint  # noqa: E402


def _save(value):
    return lambda path: torch.save({"value": value}, path)


def _objects(url: str) -> list[str]:
    store, prefix = open_store(url)
    return sorted(n[len(prefix) + 1 :] for n in store.names(prefix + "/"))


def test_round_trip_and_module_choice(url: str) -> None:
    manifest = remote_checkpoint.write(url, 7, 3, _save(torch.arange(5)), samples_seen=84)
    assert manifest.step == 7 and manifest.world_size == 3 and manifest.samples_seen == 84
    assert manifest.path == f"{url}/step-000000007" and manifest.state.startswith("state-")
    assert remote_checkpoint.verify(manifest.path) == manifest
    assert torch.equal(remote_checkpoint.load_state(manifest)["value"], torch.arange(5))
    assert _objects(url) == sorted(["step-000000007/manifest.json", f"step-000000007/{manifest.state}"])
    assert remote_checkpoint.steps(url) == [7]
    # The trainer picks the module by the location's scheme; Path() collapsing '//' is tolerated.
    assert remote_checkpoint.module_for(url) is remote_checkpoint
    assert remote_checkpoint.module_for(Path(url)) is remote_checkpoint
    assert remote_checkpoint.module_for("/tmp/ckpt") is checkpoint
    assert remote_checkpoint.newest_valid(Path(url)).step == 7


def test_existing_valid_step_is_kept(url: str) -> None:
    first = remote_checkpoint.write(url, 5, 2, _save(1))
    second = remote_checkpoint.write(url, 5, 2, _save(2))
    assert second.sha256 == first.sha256 and second.state == first.state
    assert remote_checkpoint.load_state(remote_checkpoint.newest_valid(url))["value"] == 1


def test_corrupt_newest_and_partial_upload_fall_back_with_warning(url: str, tmp_path: Path) -> None:
    remote_checkpoint.write(url, 10, 2, _save(10))
    newest = remote_checkpoint.write(url, 20, 2, _save(20))
    store, prefix = open_store(url)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"garbage")
    store.put_file(f"{prefix}/step-000000020/{newest.state}", garbage)  # corrupted in place
    store.put_file(f"{prefix}/step-000000030/state-deadbeef.pt", garbage)  # a writer died before its manifest
    warnings: list[str] = []
    found = remote_checkpoint.newest_valid(url, warn=warnings.append)
    assert found is not None and found.step == 10
    assert len(warnings) == 2 and "step-000000030" in warnings[0] and "step-000000020" in warnings[1]
    assert remote_checkpoint.load_state(found)["value"] == 10
    assert remote_checkpoint.verify(f"{url}/step-000000030") is None


def test_manifest_naming_a_missing_state_is_invalid(url: str, tmp_path: Path) -> None:
    manifest = remote_checkpoint.write(url, 3, 1, _save(3))
    store, prefix = open_store(url)
    store.delete(f"{prefix}/step-000000003/{manifest.state}")
    assert remote_checkpoint.verify(manifest.path) is None
    assert remote_checkpoint.newest_valid(url, warn=lambda _: None) is None


def test_prune_keeps_newest_and_removes_every_object(url: str) -> None:
    for step in (1, 2, 3, 4):
        remote_checkpoint.write(url, step, 1, _save(step))
    assert remote_checkpoint.prune(url, keep=2) == [2, 1]
    assert remote_checkpoint.steps(url) == [4, 3]
    assert {name.split("/")[0] for name in _objects(url)} == {"step-000000004", "step-000000003"}


WRITER = """
import sys, torch
from spotrun.elastic.checkpoint import remote as remote_checkpoint
m = remote_checkpoint.write(sys.argv[1], 42, 4, lambda p: torch.save({"w": torch.full((3,), 7.0), "step": 42}, p),
                            samples_seen=4200)
print(m.path)
"""

RESUMER = """
import json, sys
from spotrun.elastic.checkpoint import remote as remote_checkpoint
module = remote_checkpoint.module_for(sys.argv[1])
m = module.newest_valid(sys.argv[1])
state = module.load_state(m)
print(json.dumps({"step": m.step, "world_size": m.world_size, "samples_seen": m.samples_seen,
                  "w": state["w"].tolist()}))
"""


def test_checkpoint_written_by_one_process_is_resumed_by_a_fresh_one(url: str, env: dict[str, str]) -> None:
    child_env = {**os.environ, **env}
    wrote = subprocess.run(
        [sys.executable, "-c", WRITER, url], env=child_env, capture_output=True, text=True, timeout=120
    )
    assert wrote.returncode == 0, wrote.stderr
    resumed = subprocess.run(
        [sys.executable, "-c", RESUMER, url], env=child_env, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"step": 42, "world_size": 4, "samples_seen": 4200, "w": [7.0, 7.0, 7.0]}


# What a forked training worker does: import the trainer, then write and resume a checkpoint in
# a local directory, then on S3; prints the provider, libcloud-compute and gRPC modules loaded
# after each.
WORKER = """
import json, sys
from pathlib import Path
import torch
import spotrun.elastic.trainer
from spotrun.elastic.checkpoint import remote as remote_checkpoint
seen = {}
for name, location in (("local", Path(sys.argv[1])), ("s3", sys.argv[2])):
    module = remote_checkpoint.module_for(location)
    module.write(location, 3, 1, lambda p: torch.save({"step": 3}, p))
    assert module.load_state(module.newest_valid(location))["step"] == 3
    seen[name] = sorted(m for m in sys.modules if m.startswith(("spotrun.providers", "libcloud.compute.", "grpc")))
print(json.dumps(seen))
"""


def test_training_workers_import_only_the_storage_they_use(url: str, env: dict[str, str], tmp_path: Path) -> None:
    """No provider code at all for a local checkpoint dir; for s3:// the S3 storage module and
    its credentials, never the EC2 provider or libcloud's compute drivers."""
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path / "checkpoints"), url],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    seen = json.loads(worker.stdout)
    assert seen["local"] == []
    assert {"spotrun.providers.aws.storage", "spotrun.providers.aws.credentials"} <= set(seen["s3"])
    assert "spotrun.providers.aws.provider" not in seen["s3"]
    assert not [m for m in seen["s3"] if m.startswith(("libcloud.compute.drivers", "grpc"))]


def test_missing_bucket_and_bad_scheme_are_one_line(env: dict[str, str]) -> None:
    from spotrun.errors import ProviderError

    with pytest.raises(ProviderError, match="does not exist"):
        remote_checkpoint.write("s3://no-such-bucket-spotrun/x", 1, 1, _save(1))
    with pytest.raises(ProviderError, match="not an object storage URL"):
        open_store("ftp://host/x")
    warnings: list[str] = []
    assert remote_checkpoint.newest_valid("s3://no-such-bucket-spotrun/x", warn=warnings.append) is None
    assert warnings and "\n" not in warnings[0]


PART = 5 * 2**20  # S3's (and moto's) smallest part but the last: the small_parts fixture's part size


def _big_state(seed: int) -> dict:
    """About 12.6 MB once saved: three 5 MiB parts."""
    return {"w": torch.randn(3_150_000, generator=torch.Generator().manual_seed(seed)), "seed": seed}


def test_multipart_upload_spans_parts_and_reads_back_equal(
    url: str, small_parts: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotrun.providers.aws import storage as s3

    original = s3.S3Multipart.put_part
    lock, active, most = threading.Lock(), [0], [0]

    def put_part(self: object, *args: object) -> str:  # counts the parts on the wire at once
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.3)
            return original(self, *args)  # type: ignore[arg-type]
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(s3.S3Multipart, "put_part", put_part)
    written: list[bytes] = []

    def save(path: Path) -> None:
        torch.save(_big_state(1), path)
        written.append(path.read_bytes())

    manifest = remote_checkpoint.write(url, 5, 2, save)
    store, prefix = open_store(url)
    name = f"{prefix}/step-000000005/{manifest.state}"
    obj = store.driver.get_object(store.bucket, name)
    assert obj.size == len(written[0]) > 2 * PART
    assert obj.hash.endswith("-3")  # S3's ETag of an object completed from 3 parts
    back = tmp_path / "back"
    assert store.download(name, back) and back.read_bytes() == written[0]
    assert torch.equal(remote_checkpoint.load_state(remote_checkpoint.newest_valid(url))["w"], _big_state(1)["w"])
    assert store.pending_uploads(prefix + "/") == []
    assert most[0] == 2  # parallel, and never more than SPOTRUN_STORAGE_PARTS_IN_FLIGHT


# The start of a writer script that uploads in 5 MiB parts, one at a time, and stops dead after
# the second part (kill_mid_upload SIGKILLs it there); `state` is what it writes, as step 20.
HANG_AFTER_TWO_PARTS = """
import sys, time, torch
import spotrun.providers.aws.storage as s3
sent = []
original = s3.S3Multipart.put_part
def put_part(self, *args):
    etag = original(self, *args)
    sent.append(etag)
    if len(sent) == 2:
        print("two parts sent", flush=True)
        time.sleep(600)
    return etag
s3.S3Multipart.put_part = put_part
state = {"w": torch.randn(3_150_000, generator=torch.Generator().manual_seed(20)), "seed": 20}
"""

KILLED_WRITER = (
    HANG_AFTER_TWO_PARTS
    + """
from spotrun.elastic.checkpoint import remote as remote_checkpoint
remote_checkpoint.write(sys.argv[1], 20, 2, lambda p: torch.save(state, p))
"""
)


def kill_mid_upload(script: str, url: str, env: dict[str, str], small_parts: dict[str, str], tmp_path: Path) -> None:
    """Run `script` (HANG_AFTER_TWO_PARTS and a write to `url`) and SIGKILL it once two parts are up."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, url],
        # TMPDIR: the killed writer cannot remove its local copy of the state.
        env={**os.environ, **env, **small_parts, "SPOTRUN_STORAGE_PARTS_IN_FLIGHT": "1", "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()  # blocks until the second part is stored, or the child died
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert line == "two parts sent\n", child.stderr.read()


def test_writer_killed_mid_upload_leaves_no_checkpoint_and_the_next_write_cleans_up(
    url: str, env: dict[str, str], small_parts: dict[str, str], tmp_path: Path
) -> None:
    remote_checkpoint.write(url, 10, 2, _save(10))
    kill_mid_upload(KILLED_WRITER, url, env, small_parts, tmp_path)
    store, prefix = open_store(url)
    (upload,) = store.pending_uploads(prefix + "/")
    assert upload.name.startswith(f"{prefix}/step-000000020/state-")
    assert remote_checkpoint.steps(url) == [10]  # the unfinished upload is no object
    assert remote_checkpoint.verify(f"{url}/step-000000020") is None
    assert remote_checkpoint.newest_valid(url, warn=lambda _: None).step == 10

    manifest = remote_checkpoint.write(url, 30, 2, lambda p: torch.save(_big_state(30), p))
    assert store.pending_uploads(prefix + "/") == []  # the dead writer's parts are freed
    found = remote_checkpoint.newest_valid(url)
    assert found is not None and found.step == 30 and found.sha256 == manifest.sha256
    assert torch.equal(remote_checkpoint.load_state(found)["w"], _big_state(30)["w"])


def test_a_part_that_keeps_failing_aborts_the_upload(
    url: str, small_parts: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotrun.providers.aws import storage as s3

    from spotrun.errors import ProviderError

    original = s3.S3Multipart.put_part
    tries: list[int] = []

    def put_part(
        self: object, driver: object, container: object, name: str, upload_id: str, number: int, data: bytes
    ) -> str:
        tries.append(number)
        if number == 2:
            raise ConnectionResetError("the network dropped part 2")
        return original(self, driver, container, name, upload_id, number, data)

    monkeypatch.setattr(s3.S3Multipart, "put_part", put_part)
    monkeypatch.setattr("spotrun.providers.storage.time.sleep", lambda _: None)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(2 * PART + 1))
    store, prefix = open_store(url)
    with pytest.raises(ProviderError, match=r"upload part 2 of .*ConnectionResetError"):
        store.put_file(f"{prefix}/big", big)
    assert tries.count(2) == 3  # retried, then given up
    assert store.pending_uploads(prefix + "/") == [] and store.names(prefix + "/") == []


def test_transfer_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from spotrun.providers.storage import Transfer

    from spotrun.errors import ProviderError

    monkeypatch.delenv("SPOTRUN_STORAGE_PART_BYTES", raising=False)
    monkeypatch.setenv("SPOTRUN_STORAGE_PARTS_IN_FLIGHT", "8")
    assert Transfer.from_env() == Transfer(part_bytes=64 * 2**20, in_flight=8)
    monkeypatch.setenv("SPOTRUN_STORAGE_PART_BYTES", "64M")
    with pytest.raises(ProviderError, match="SPOTRUN_STORAGE_PART_BYTES='64M' is not a positive integer"):
        Transfer.from_env()
