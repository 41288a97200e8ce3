"""The agent -> trainer "checkpoint now" channel: requests, and withdrawing a join that is moot."""

from __future__ import annotations

from pathlib import Path

from spotrun.elastic.trainer import _ControlFile
from spotrun.node.supervisor import ControlFile


def test_request_is_seen_by_workers_started_after_it(tmp_path: Path) -> None:
    agent = ControlFile(tmp_path / "control.json")
    assert agent.request("join:n4") == 1
    worker = _ControlFile(tmp_path / "control.json")  # workers starting during a re-formation
    assert worker.requested()
    worker.served()
    assert not _ControlFile(tmp_path / "control.json").requested()


def test_withdrawn_join_is_skipped_by_workers_started_after_it(tmp_path: Path) -> None:
    agent = ControlFile(tmp_path / "control.json")
    agent.request("join:n4")
    assert not agent.withdraw("join:n5"), "another node's join stays"
    assert agent.withdraw("join:n4")
    assert not _ControlFile(tmp_path / "control.json").requested()
    assert not agent.withdraw("join:n4"), "nothing pending any more"


def test_a_join_is_not_withdrawn_over_another_pending_request(tmp_path: Path) -> None:
    agent = ControlFile(tmp_path / "control.json")
    agent.request("leave:n1")
    agent.request("join:n4")  # two pending: withdrawing would drop the leave
    assert not agent.withdraw("join:n4")
    assert _ControlFile(tmp_path / "control.json").requested()
