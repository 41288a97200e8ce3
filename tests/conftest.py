"""Shared fixtures: a real etcd, a connected store with a fresh cluster name, a private $SPOTRUN_HOME."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotrun.state import etcd_server as etcd_mod
from spotrun.state import store as store_mod


def _require_etcd() -> None:
    import os

    if not (os.environ.get("SPOTRUN_ETCD_BIN") or shutil.which("etcd")):
        pytest.skip("etcd binary not found (apt-get install etcd-server, or set $SPOTRUN_ETCD_BIN)")


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[etcd_mod.EtcdProcess]:
    """One real etcd for the whole session, on free loopback ports; stopped at the end."""
    _require_etcd()
    proc = etcd_mod.EtcdProcess(tmp_path_factory.mktemp("etcd") / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def etcd_process(tmp_path: Path) -> Iterator[etcd_mod.EtcdProcess]:
    """A private etcd for one test (for tests that stop or restart it); always stopped after."""
    _require_etcd()
    proc = etcd_mod.EtcdProcess(tmp_path / "etcd-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def cluster() -> str:
    """A cluster name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(etcd_server: etcd_mod.EtcdProcess, cluster: str) -> Iterator[store_mod.Store]:
    """A Store connected to the session etcd; the test's cluster keys are deleted afterwards."""
    st = store_mod.connect([etcd_server.endpoint])
    try:
        yield st
    finally:
        try:
            st.delete_cluster(cluster)
        finally:
            st.close()


@pytest.fixture
def spotrun_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """$SPOTRUN_HOME pointed at a fresh temp dir; any embedded etcd started there is stopped after."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    try:
        yield home
    finally:
        if (home / "etcd" / "state.json").exists():
            etcd_mod.stop()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """A real moto server (EC2, S3, ...) on a free loopback port, for the module's tests."""
    import logging

    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# Object storage: moto's S3 server (moto_url) through libcloud, as tests/test_remote*_checkpoint.py use it.
@pytest.fixture
def env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The AWS credentials and S3 endpoint of moto's server, set in this process's environment."""
    values = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "SPOTRUN_S3_ENDPOINT_URL": moto_url,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return values


@pytest.fixture
def url(env: dict[str, str]) -> str:
    """A checkpoint location in a new, empty bucket: s3://<bucket>/runs/llm."""
    from spotrun.providers.storage import open_store

    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    store, _ = open_store(f"s3://{bucket}")
    store.driver.create_container(bucket)
    return f"s3://{bucket}/runs/llm"


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Multipart uploads in 5 MiB parts (S3's smallest but the last), two in flight."""
    values = {"SPOTRUN_STORAGE_PART_BYTES": str(5 * 2**20), "SPOTRUN_STORAGE_PARTS_IN_FLIGHT": "2"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values
