"""spotrun.node.protocol beyond the control file: the progress report, the peer-lost marker, and
that the module stays import-light (the agent and every forked training worker import it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.node import protocol
from spotrun.node.protocol import CheckpointReport, ProgressReport, read_progress, write_progress


def test_progress_report_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    assert read_progress(path) is None, "no report before the trainer wrote one"
    checkpoint = CheckpointReport(40, "/ckpt/step-000000040", 1234, "ab" * 32, 1700000000.25, 0.0312)
    report = ProgressReport(40, 2, 118.5, 0.25, 1700000001.5, checkpoint)
    write_progress(path, report)
    assert read_progress(path) == report
    assert json.loads(path.read_text())["checkpoint"]["sha256"] == "ab" * 32
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"], "no temp file is left behind"


def test_a_checkpoint_before_any_step_is_reported_without_a_step(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    write_progress(path, ProgressReport(checkpoint=CheckpointReport(7, "p", 1, "s", 2.0)))
    got = read_progress(path)
    assert got is not None and got.step is None and got.checkpoint == CheckpointReport(7, "p", 1, "s", 2.0)


@pytest.mark.parametrize("text", ["", "[]", '"x"', '{"step": 1, "bogus": 2}', '{"checkpoint": {"step": 1}}'])
def test_a_garbled_progress_file_is_no_report(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError):
        ProgressReport.from_json(text)
    (tmp_path / "progress.json").write_text(text)
    assert read_progress(tmp_path / "progress.json") is None


def test_peer_lost_marker_is_touched_only_where_the_launcher_asked(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "peer_lost"
    monkeypatch.delenv(protocol.PEER_LOST_FILE_ENV, raising=False)
    protocol.mark_peer_lost()
    assert not marker.exists()
    monkeypatch.setenv(protocol.PEER_LOST_FILE_ENV, str(marker))
    protocol.mark_peer_lost()
    assert marker.exists()
    monkeypatch.setenv(protocol.PEER_LOST_FILE_ENV, str(tmp_path / "missing-dir" / "peer_lost"))
    protocol.mark_peer_lost()  # best effort: no error


def test_exit_codes_keep_their_numbers() -> None:
    # torch elastic, the launcher's parent and scripts that exit by hand see the plain numbers.
    assert (protocol.ExitCode.OK, protocol.ExitCode.FAILED, protocol.ExitCode.REFORM) == (0, 1, 75)


def test_protocol_imports_only_the_standard_library() -> None:
    code = (
        "import sys; import spotrun.node.protocol; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('spotrun', 'torch', 'grpc', 'pyetcd', 'etcd3')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["spotrun", "spotrun.node", "spotrun.node.protocol"])


def test_the_leave_margin_follows_what_a_leave_costs() -> None:
    from spotrun.node.agent import DEFAULT_LEAVE_MARGIN_S, MIN_LEAVE_MARGIN_S, leave_margin

    live = ProgressReport(step=40, live_recovery=True, step_s=1.5)
    assert leave_margin(live, checkpoint_s=4.0) == 4.0, "live recovery: a second plus two steps, not the save"
    assert leave_margin(ProgressReport(step=40, live_recovery=True, step_s=0.01), 4.0) == MIN_LEAVE_MARGIN_S
    storage = ProgressReport(step=40, step_s=1.5)
    assert leave_margin(storage, checkpoint_s=4.0) == 13.0, "through storage: three saves plus a second"
    assert leave_margin(storage, checkpoint_s=None) == DEFAULT_LEAVE_MARGIN_S
    assert leave_margin(None, checkpoint_s=0.1) == MIN_LEAVE_MARGIN_S


def test_progress_reports_say_whether_the_state_survives_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    write_progress(path, ProgressReport(step=3, live_recovery=True, step_s=0.25))
    got = read_progress(path)
    assert got is not None and got.live_recovery and got.step_s == 0.25
