"""The agent -> trainer "checkpoint now" channel: requests, and withdrawing a join that is moot."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotrun.node.protocol import ControlCommand, ControlReader, ControlRequest, ControlWriter, served_path

JOIN, LEAVE = ControlCommand.JOIN, ControlCommand.LEAVE


def test_request_is_seen_by_workers_started_after_it(tmp_path: Path) -> None:
    agent = ControlWriter(tmp_path / "control.json")
    assert agent.request(JOIN, "n4") == 1
    worker = ControlReader(tmp_path / "control.json")  # workers starting during a re-formation
    assert worker.requested()
    worker.served()
    assert not ControlReader(tmp_path / "control.json").requested()


def test_withdrawn_join_is_skipped_by_workers_started_after_it(tmp_path: Path) -> None:
    agent = ControlWriter(tmp_path / "control.json")
    agent.request(JOIN, "n4")
    assert not agent.withdraw(JOIN, "n5"), "another node's join stays"
    assert agent.withdraw(JOIN, "n4")
    assert not ControlReader(tmp_path / "control.json").requested()
    assert not agent.withdraw(JOIN, "n4"), "nothing pending any more"


def test_a_join_is_not_withdrawn_over_another_pending_request(tmp_path: Path) -> None:
    agent = ControlWriter(tmp_path / "control.json")
    agent.request(LEAVE, "n1")
    agent.request(JOIN, "n4")  # two pending: withdrawing would drop the leave
    assert not agent.withdraw(JOIN, "n4")
    assert ControlReader(tmp_path / "control.json").requested()


def test_a_leave_is_not_withdrawn_as_a_join(tmp_path: Path) -> None:
    agent = ControlWriter(tmp_path / "control.json")
    agent.request(LEAVE, "n4")
    assert not agent.withdraw(JOIN, "n4")
    assert ControlReader(tmp_path / "control.json").requested()


def test_a_request_after_the_control_file_was_lost_is_still_seen(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    agent = ControlWriter(control)
    agent.request(JOIN, "n4")
    agent.request(JOIN, "n5")
    ControlReader(control).served()
    control.unlink()
    assert agent.request(LEAVE, "n1") == 3, "the seq stays above the served one"
    assert ControlReader(control).requested()


def test_request_round_trips_and_garbage_is_refused(tmp_path: Path) -> None:
    request = ControlRequest(7, LEAVE, "n1", 1700000000.5)
    assert ControlRequest.from_json(request.to_json()) == request
    for text in ("", "[]", '{"seq": 1}', '{"seq": 1, "command": "reboot", "node": "n", "at": 0}'):
        with pytest.raises(ValueError):
            ControlRequest.from_json(text)
    (tmp_path / "control.json").write_text("not json")
    assert not ControlReader(tmp_path / "control.json").requested()
    assert served_path(tmp_path / "control.json") == tmp_path / "control.json.served"
