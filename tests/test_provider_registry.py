"""The provider registry is the one list of provider names, and every provider package exports
the same light names (catalog, credentials, notices, the provider class on first use)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from spotrun.providers import Feature, NoticeSpec, get_provider, known_providers, provider_package, supports
from spotrun.providers.storage import SCHEMES

from spotrun import providers
from spotrun.errors import ProviderError


@pytest.mark.parametrize("name", known_providers())
def test_every_package_exports_the_same_names(name: str) -> None:
    package = provider_package(name)
    cls = type(get_provider(name))
    assert cls.__name__ in package.__all__ and getattr(package, cls.__name__) is cls
    assert set(package.__all__) == {cls.__name__, "catalog", "credentials", "notices"}
    assert isinstance(package.catalog.FEATURES, frozenset) and all(
        isinstance(f, Feature) for f in package.catalog.FEATURES
    )
    assert package.catalog.ZONE_SUFFIX is None or isinstance(package.catalog.ZONE_SUFFIX, str)
    assert package.notices.LEAD_S > 0
    assert package.notices.PROTOCOL is None or isinstance(package.notices.PROTOCOL, NoticeSpec)
    assert callable(package.credentials.head_env)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        package.Nope  # noqa: B018


@pytest.mark.parametrize("name", known_providers())
def test_package_facts_agree_with_the_provider_class(name: str) -> None:
    provider = get_provider(name)
    assert (Feature.CHAOS in provider_package(name).catalog.FEATURES) == supports(provider, "preempt")
    if name in providers.notice_protocols():
        assert provider.notice_protocol == name
    if providers.has_feature(name, Feature.RECIPE_PRICES):
        assert provider_package(name).catalog.DEFAULT_PRICES


def test_names_and_capabilities_come_from_the_registry() -> None:
    assert known_providers() == ["local", "aws", "gcp", "azure"]
    assert providers.notice_protocols() == ["aws", "gcp", "azure"]
    assert providers.with_feature(Feature.HEAD_VM) == ["aws", "gcp", "azure"]
    assert providers.with_feature(Feature.EMBEDDED_ETCD) == ["local"]
    assert set(SCHEMES) == {"s3", "gs", "azure"}
    for package in providers.storage_schemes().values():
        assert callable(importlib.import_module(package + ".storage").driver)
    with pytest.raises(ProviderError, match="unknown provider 'ibm'") as info:
        provider_package("ibm")
    assert "local, aws, gcp, azure" in str(info.value)


def test_every_provider_package_is_installed() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    installed = set(pyproject["tool"]["setuptools"]["packages"])
    assert {provider_package(name).__name__ for name in known_providers()} <= installed


def test_importing_every_package_loads_no_provider_class_and_no_sdk() -> None:
    code = (
        "import json, sys\n"
        "from spotrun.providers import known_providers, provider_package\n"
        "for name in known_providers(): provider_package(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.endswith('.provider') or m.startswith('libcloud'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []


def test_head_env_ships_each_clouds_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    aws_file = tmp_path / "aws-credentials"
    aws_file.write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n")
    gcp_key = tmp_path / "key.json"
    gcp_key.write_bytes(b'{"type": "service_account"}')
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws_file))
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    monkeypatch.setenv("SPOTRUN_AWS_IMAGE", "ami-1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(gcp_key))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    monkeypatch.setenv("SPOTRUN_AZURE_REGIONS", "eastus")

    def head_env(name: str) -> tuple[dict[str, str], dict[str, bytes]]:
        return provider_package(name).credentials.head_env("/secrets")

    env, files = head_env("aws")
    assert files == {}
    assert {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "SPOTRUN_AWS_IMAGE")} == {
        "AWS_ACCESS_KEY_ID": "A",
        "AWS_SECRET_ACCESS_KEY": "B",
        "AWS_REGION": "us-west-2",
        "SPOTRUN_AWS_IMAGE": "ami-1",
    }
    assert "AWS_SESSION_TOKEN" not in env and "GOOGLE_CLOUD_PROJECT" not in env
    env, files = head_env("gcp")
    assert (
        env["GOOGLE_CLOUD_PROJECT"] == "p" and env["GOOGLE_APPLICATION_CREDENTIALS"] == "/secrets/gcp-credentials.json"
    )
    assert files == {"gcp-credentials.json": b'{"type": "service_account"}'} and "AWS_REGION" not in env
    env, files = head_env("azure")
    assert env["AZURE_TENANT_ID"] == "t" and env["SPOTRUN_AZURE_REGIONS"] == "eastus" and files == {}
    assert not [k for k in env if not k.startswith(("AZURE_", "SPOTRUN_AZURE_"))]
    assert head_env("local") == ({}, {})
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ProviderError, match="cannot read GOOGLE_APPLICATION_CREDENTIALS"):
        head_env("gcp")
