"""Where the recipe lives: the validated spec in etcd (spotrun.state.spec), and the little the local
cluster file keeps to reach and tear down the cluster (spotrun.state.clusterfile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotrun.controller.bootstrap import REMOTE_WORKDIR
from spotrun.controller.head_entry import install_record
from spotrun.errors import ControlPlaneError, NotFoundError
from spotrun.paths import cluster_dir
from spotrun.recipe.schema import Recipe
from spotrun.state import clusterfile
from spotrun.state.clusterfile import ClusterFile
from spotrun.state.spec import Spec, decode_spec, put_recipe, read_spec, recipe_from_spec

EXTERNAL = {"mode": "external", "endpoints": ["10.0.0.5:2379"], "tls": {"ca": "/pki/ca.pem"}}


def recipe(**fields) -> Recipe:
    base = {
        "name": "demo",
        "resources": [{"provider": "local", "instance_type": "cpu-small", "prices": {"spot": 0.1, "on_demand": 0.4}}],
        "nodes": {"min": 1, "max": 4},
        "run": "python train.py --steps 100",
        "env": {"GREETING": "hello"},
    }
    return Recipe.model_validate({**base, **fields})


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_spec_reads_back_as_the_validated_recipe(store, cluster: str) -> None:
    assert read_spec(store, cluster) is None
    with pytest.raises(NotFoundError, match="has no recipe in etcd"):
        recipe_from_spec(store, cluster)
    written = recipe(name=cluster)
    version = put_recipe(store, written)
    assert read_spec(store, cluster) == Spec(written, version)
    assert recipe_from_spec(store, cluster) == written
    changed = recipe(name=cluster, env={"GREETING": "bye"})
    assert put_recipe(store, changed) > version and recipe_from_spec(store, cluster) == changed


def test_an_invalid_spec_is_a_control_plane_error(store, cluster: str) -> None:
    store.put_spec(cluster, {"name": cluster, "nodes": {"min": 1, "max": 2}, "run": "x"})
    with pytest.raises(ControlPlaneError, match=r"is not a valid recipe: resources: Field required"):
        read_spec(store, cluster)
    with pytest.raises(ControlPlaneError, match="is not a valid recipe: not JSON"):
        decode_spec(cluster, b"{")


def test_the_cluster_file_keeps_only_what_reaching_and_teardown_need(home: Path) -> None:
    written = recipe(control_plane=EXTERNAL)
    ClusterFile.for_recipe(written, ["http://10.0.0.5:2379"], embedded=False, train=False).save()
    record = clusterfile.load("demo")
    assert record.candidates() == written.resources
    assert (record.endpoints, record.tls, record.train) == (["http://10.0.0.5:2379"], {"ca": "/pki/ca.pem"}, False)
    text = (home / "clusters" / "demo" / "cluster.json").read_text()
    assert "GREETING" not in text and "train.py" not in text, "env and run live in etcd only"


def test_a_cluster_file_from_before_still_reads(home: Path) -> None:
    """A file written when it carried the whole recipe (a cluster started by an older spotrun)."""
    written = recipe(control_plane=EXTERNAL)
    old = {
        "name": "demo",
        "recipe_json": written.to_json(),
        "endpoints": ["http://10.0.0.5:2379"],
        "embedded": False,
        "train": True,
        "created_at": 1.0,
        "agent_endpoints": None,
        "head": None,
    }
    (cluster_dir("demo") / "cluster.json").write_text(json.dumps(old))
    record = clusterfile.load("demo")
    assert record.candidates() == written.resources and record.tls == {"ca": "/pki/ca.pem"}
    record.save()
    assert "recipe_json" not in json.loads((home / "clusters" / "demo" / "cluster.json").read_text())


def test_a_head_vm_installs_the_shipped_record_with_its_uploaded_workdir(home: Path, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    shipped = ClusterFile.for_recipe(recipe(), ["http://127.0.0.1:2379"], embedded=False)
    (secrets / "cluster.json").write_text(shipped.to_json())
    for name in ("id_ed25519", "id_ed25519.pub"):
        (secrets / name).write_text("key")
    record = install_record("demo", secrets)
    assert record.workdir == str(Path(REMOTE_WORKDIR).expanduser())
    assert record.candidates() == shipped.candidates() and clusterfile.load("demo") == record
