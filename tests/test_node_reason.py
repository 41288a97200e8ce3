"""Node-record reasons that drive behaviour are an enum; records written before it stay readable."""

from __future__ import annotations

import json

import pytest
from spotrun.providers.base import Instance, InstanceState

from spotrun.controller.loop import Controller
from spotrun.state.records import NodeReason, NodeRecord, NodeState, decode, encode


def _record(**fields) -> NodeRecord:
    return NodeRecord("vm-1", "c", "local", "z", "t", 0.1, 0.4, **fields)


def test_the_etcd_json_carries_the_reason_text() -> None:
    data = json.loads(encode(_record(state=NodeState.LEAVING, reason=NodeReason.LEFT)))
    assert (data["state"], data["reason"], data["detail"]) == ("leaving", "left the training job", "")
    assert decode(NodeRecord, encode(_record(reason=NodeReason.DRAIN, detail="drain: scale down to 2"))) == _record(
        reason=NodeReason.DRAIN, detail="drain: scale down to 2"
    )


@pytest.mark.parametrize(
    ("old", "reason", "detail"),
    [
        ("left the training job", NodeReason.LEFT, ""),
        ("training finished", NodeReason.FINISHED, ""),
        ("drain requested", NodeReason.DRAIN, ""),
        ("", NodeReason.NONE, ""),
        ("agent registered", NodeReason.NONE, "agent registered"),
    ],
)
def test_old_records_decode_to_the_same_meaning(old: str, reason: NodeReason, detail: str) -> None:
    data = {**json.loads(encode(_record())), "reason": old}
    del data["detail"]  # records before NodeReason had no detail
    got = decode(NodeRecord, json.dumps(data))
    assert (got.reason, got.detail) == (reason, detail)
    assert got.reason_text == old


def test_reason_text_prefers_the_detail() -> None:
    assert _record(reason=NodeReason.DRAIN).reason_text == "drain requested"
    assert _record(reason=NodeReason.DRAIN, detail="drain: replacement ready").reason_text == "drain: replacement ready"


def _instance() -> Instance:
    return Instance(
        "vm-1", "c", "local", "z", "t", InstanceState.RUNNING, None, "127.0.0.1", 22, "u", "k", "", 0.1, 0.4, 1.0
    )


@pytest.mark.parametrize(
    ("state", "reason", "detail", "left", "finished"),
    [
        (NodeState.LEAVING, NodeReason.LEFT, "", True, False),
        (NodeState.RUNNING, NodeReason.FINISHED, "", False, True),
        (NodeState.LEAVING, NodeReason.DRAIN, "drain: scale down to 2", False, False),
        # Free text never drives behaviour, even when it reads like a reason.
        (NodeState.LEAVING, NodeReason.NONE, "left the training job", False, False),
        (NodeState.RUNNING, NodeReason.NONE, "training finished", False, False),
    ],
)
def test_the_controller_acts_on_the_reason_not_the_text(state, reason, detail, left, finished) -> None:
    view = Controller._view(
        _instance(), _record(state=state, reason=reason, detail=detail), True, True, None, [], False
    )
    assert (view.leaving, view.left, view.finished) == (state == NodeState.LEAVING, left, finished)
