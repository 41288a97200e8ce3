"""Event kinds are an enum: history written by older or newer spotruns still decodes, and code acts
on the kind, never on the message text."""

from __future__ import annotations

from spotrun.state.records import Event, EventKind, decode, encode


def test_an_event_keeps_its_kind_through_etcd_json() -> None:
    event = Event(seq=3, at=1.0, kind=EventKind.FINISHED, message="vm-1: training job finished", node="vm-1")
    back = decode(Event, encode(event))
    assert back == event and back.kind is EventKind.FINISHED
    assert b'"kind":"finished"' in encode(event), "the JSON keeps the plain text an older spotrun wrote"
    assert f"{event.kind}: {event.message}" == "finished: vm-1: training job finished", "shown as its text"


def test_old_text_kinds_decode_and_unknown_ones_are_other() -> None:
    assert decode(Event, '{"seq": 1, "at": 0, "kind": "budget", "message": "m"}').kind is EventKind.BUDGET
    assert decode(Event, '{"seq": 2, "at": 0, "kind": "rebalance", "message": "m"}').kind is EventKind.OTHER


def test_every_node_state_that_ends_a_vm_has_an_event_kind() -> None:
    from spotrun.state.records import NodeState

    # The controller records a gone VM with an event of the state's own name.
    assert {EventKind(s.value) for s in NodeState if s.is_gone} == {
        EventKind.PREEMPTED,
        EventKind.TERMINATED,
        EventKind.FAILED,
    }
