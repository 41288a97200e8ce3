"""The package installs as users get it: `spotrun.tui`/`spotrun.providers`, no stray top-level packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_IGNORE = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache")


def _fresh_venv(root: Path) -> Path:
    """A new virtualenv whose dependencies come from the running one (a .pth line, not a copy)."""
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Appended after the venv's own site-packages, so the freshly installed spotrun wins.
    Path(site, "_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def _pip_install(python: Path, *args: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
    )


def _where(python: Path, module: str) -> Path:
    out = subprocess.run(
        [python, "-c", f"import {module}; print({module}.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout.strip()
    return Path(out)


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_install_gives_spotrun_subpackages(tmp_path: Path, editable: bool) -> None:
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=_IGNORE)
    python = _fresh_venv(tmp_path)
    _pip_install(python, *(["-e", str(source)] if editable else [str(source)]))

    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    expected_root = source if editable else site / "spotrun"
    assert _where(python, "spotrun.tui").parent == (source / "tui" if editable else expected_root / "tui")
    assert _where(python, "spotrun.providers").parent == (
        source / "providers" if editable else expected_root / "providers"
    )
    assert not (site / "tui").exists() and not (site / "providers").exists()
    for stray in ("tui", "providers"):
        probe = subprocess.run([python, "-c", f"import {stray}"], capture_output=True, text=True, cwd="/")
        assert probe.returncode != 0, f"top-level package {stray!r} is importable"

    cli = subprocess.run([python.parent / "spotrun", "--version"], capture_output=True, text=True)
    assert cli.returncode == 0 and cli.stdout.startswith("spotrun ")
    as_module = subprocess.run([python, "-m", "spotrun", "--help"], capture_output=True, text=True, cwd="/")
    assert as_module.returncode == 0 and "validate" in as_module.stdout
