"""The CLI surface: help, version, exit codes, lazy imports, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spotrun.cli import main
from spotrun.errors import EXIT_CODES

HEAVY = ("torch", "paramiko", "libcloud", "textual", "pyetcd", "grpc")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotrun", *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


def test_help_lists_commands_and_exit_codes() -> None:
    result = _run("--help", NO_COLOR="1")
    assert result.returncode == 0
    assert "validate" in result.stdout and "etcd" in result.stdout
    for code in EXIT_CODES:
        assert f"{code} " in result.stdout.replace("\n", " ")
    assert "\x1b[" not in result.stdout, "NO_COLOR output must carry no escape codes"


def test_version_and_module_entry() -> None:
    from spotrun import __version__

    result = _run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"spotrun {__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["validate", "--help"], ["etcd", "--help"]])
def test_help_does_not_import_heavy_libraries(argv: list[str]) -> None:
    code = (
        f"import sys\nfrom spotrun.cli import main\nrc = main({argv!r})\n"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]\nassert rc == 0, rc\nassert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_usage_error_is_exit_2_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert main(["validate"]) == 2
    err = capsys.readouterr().err
    assert "No such command" in err and "Traceback" not in err


def test_spotrun_error_is_one_line_with_its_exit_code(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path))
    monkeypatch.setenv("SPOTRUN_ETCD_BIN", str(tmp_path / "no-etcd-here"))
    assert main(["etcd", "start"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("spotrun: error: ") and err.count("\n") == 1 and "Traceback" not in err
