"""The controller's pure planning rules, case by case."""

from __future__ import annotations

from spotrun.plan import Blocked, CloseLedger, Desired, Drain, Launch, NodeView, Observed, StopCluster, Terminate, plan

D = Desired(target=3, min=1, max=4)


def _nodes(*specs: dict) -> list[NodeView]:
    return [NodeView(**{"id": f"n{i}", "price_per_hour": 0.1, "alive": True, "ready": True, **spec})
            for i, spec in enumerate(specs)]


def test_steady_state_does_nothing() -> None:
    assert plan(D, Observed(_nodes({}, {}, {}))) == []


def test_missing_nodes_are_launched() -> None:
    assert plan(D, Observed(_nodes({}))) == [Launch(2, "reach target 3")]


def test_notice_launches_replacement_at_once() -> None:
    actions = plan(D, Observed(_nodes({}, {}, {"noticed": True, "notice_deadline": 100.0}), now=50.0))
    assert actions == [Launch(1, "replace noticed n2", replaces=("n2",))]


def test_make_before_break_may_pass_max_for_a_dying_node() -> None:
    full = Desired(target=2, min=1, max=2)
    actions = plan(full, Observed(_nodes({}, {"noticed": True, "notice_deadline": 100.0}), now=1.0))
    assert actions == [Launch(1, "replace noticed n1", replaces=("n1",))]


def test_ready_replacement_swaps_with_noticed_node() -> None:
    nodes = _nodes({}, {}, {"noticed": True, "notice_deadline": 100.0}, {"replaces": "n2"})
    assert plan(D, Observed(nodes, now=10.0)) == [Drain("n2", "drain: replacement ready")]


def test_booting_replacement_does_not_swap_yet() -> None:
    nodes = _nodes({}, {}, {"noticed": True, "notice_deadline": 100.0}, {"replaces": "n2", "ready": False})
    assert plan(D, Observed(nodes, now=10.0)) == []


def test_deadline_passed_and_left_nodes_are_terminated() -> None:
    nodes = _nodes({}, {}, {}, {"noticed": True, "notice_deadline": 5.0, "leaving": True}, {"leaving": True, "left": True})
    actions = plan(D, Observed(nodes, now=6.0))
    assert actions == [Terminate("n3", "preemption deadline passed"), Terminate("n4", "left the training job")]


def test_gone_node_closes_ledger_and_is_replaced() -> None:
    actions = plan(D, Observed(_nodes({}, {}, {"gone": True})))
    assert actions == [CloseLedger("n2", "the provider reports the VM gone"), Launch(1, "reach target 3")]
    assert plan(D, Observed(_nodes({}, {}, {"gone": True, "ledger_open": False}, {}))) == []


def test_scale_down_drains_most_expensive_first() -> None:
    nodes = _nodes({"price_per_hour": 0.1}, {"price_per_hour": 0.3}, {"price_per_hour": 0.2}, {"price_per_hour": 0.1})
    actions = plan(Desired(target=2, min=1, max=4), Observed(nodes))
    assert actions == [Drain("n1", "drain: scale down to 2"), Drain("n2", "drain: scale down to 2")]


def test_draining_nodes_are_not_drained_twice() -> None:
    nodes = _nodes({}, {}, {}, {"leaving": True})
    assert plan(D, Observed(nodes)) == []


def test_budget_per_hour_limits_launches() -> None:
    desired = Desired(target=4, min=1, max=4, max_per_hour=0.35, launch_price=0.1)
    actions = plan(desired, Observed(_nodes({}, {})))
    assert actions[0] == Blocked(2, 1, "budget: burn 0.2000 $/h + 2 x 0.1000 $/h would pass max_per_hour 0.35")
    assert actions[1] == Launch(1, "reach target 4")


def test_budget_total_stops_cluster() -> None:
    desired = Desired(target=3, min=1, max=4, max_total=1.0)
    nodes = _nodes({}, {"leaving": True}, {"alive": False})
    actions = plan(desired, Observed(nodes, spent_total=1.2))
    assert actions == [StopCluster("budget: spent 1.2000 $ >= max_total 1.0 $"),
                       Drain("n0", "drain: budget max_total reached"),
                       Terminate("n2", "budget max_total reached")]
    assert plan(desired, Observed(_nodes({"left": True, "leaving": True}), spent_total=1.2, stopped=True)) == [
        Terminate("n0", "budget max_total reached")]


def test_unfinished_launch_is_resumed_with_its_key() -> None:
    actions = plan(D, Observed(_nodes({}), pending_launch=("k-1", 2, 0)))
    assert actions == [Launch(2, "resume an unfinished launch", key="k-1")]
    # One of its two VMs is already visible (and counted): nothing more is launched, nothing drained.
    actions = plan(D, Observed(_nodes({}, {}), pending_launch=("k-1", 2, 1)))
    assert actions == [Launch(2, "resume an unfinished launch", key="k-1")]
