"""The controller's pure planning rules, case by case."""

from __future__ import annotations

from spotrun.controller.plan import (
    Activate,
    Blocked,
    CloseLedger,
    Desired,
    Drain,
    Launch,
    NodeView,
    Observed,
    StopCluster,
    Terminate,
    plan,
)

D = Desired(target=3, min=1, max=4)


def _nodes(*specs: dict) -> list[NodeView]:
    return [
        NodeView(**{"id": f"n{i}", "price_per_hour": 0.1, "alive": True, "ready": True, **spec})
        for i, spec in enumerate(specs)
    ]


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


NOTICED = {"noticed": True, "notice_deadline": 100.0}


def test_replacement_lost_while_booting_is_replaced_again() -> None:
    nodes = _nodes({}, {}, NOTICED, {"replaces": "n2", "ready": False, "alive": False, "gone": True})
    assert plan(D, Observed(nodes, now=10.0)) == [
        CloseLedger("n3", "the provider reports the VM gone"),
        Launch(
            1, "replace noticed n2; lost n3 (replacement of n2)", replaces=("n2",), lost=("n3 (replacement of n2)",)
        ),
    ]


def test_replacement_lost_while_the_noticed_node_swaps_with_it_is_replaced_again() -> None:
    # The noticed node was drained for its ready replacement, which then died: the noticed node
    # leaves anyway (it is not undrained), and another replacement is launched at once.
    nodes = _nodes({}, {}, {**NOTICED, "leaving": True}, {"replaces": "n2", "gone": True})
    assert plan(D, Observed(nodes, now=10.0)) == [
        CloseLedger("n3", "the provider reports the VM gone"),
        Launch(
            1, "replace noticed n2; lost n3 (replacement of n2)", replaces=("n2",), lost=("n3 (replacement of n2)",)
        ),
    ]
    # The next pass sees the loss recorded: the new replacement is not launched twice.
    later = _nodes({}, {}, {**NOTICED, "leaving": True}, {"replaces": "n2", "gone": True, "ledger_open": False})
    booting = NodeView("n4", 0.1, replaces="n2")
    assert plan(D, Observed([*later, booting], now=11.0)) == []


def test_replacement_lost_after_the_swap_is_replaced() -> None:
    nodes = _nodes({}, {}, {**NOTICED, "leaving": True, "left": True}, {"replaces": "n2", "gone": True})
    assert plan(D, Observed(nodes, now=10.0)) == [
        CloseLedger("n3", "the provider reports the VM gone"),
        Terminate("n2", "left the training job"),
        Launch(
            1, "replace noticed n2; lost n3 (replacement of n2)", replaces=("n2",), lost=("n3 (replacement of n2)",)
        ),
    ]


def test_noticed_node_past_its_deadline_is_terminated_though_its_replacement_was_lost() -> None:
    nodes = _nodes({}, {}, {**NOTICED, "leaving": True}, {"replaces": "n2", "gone": True, "ledger_open": False})
    assert plan(D, Observed([*nodes, NodeView("n4", 0.1, replaces="n2")], now=100.0)) == [
        Terminate("n2", "preemption deadline passed")
    ]


def test_deadline_passed_and_left_nodes_are_terminated() -> None:
    nodes = _nodes(
        {}, {}, {}, {"noticed": True, "notice_deadline": 5.0, "leaving": True}, {"leaving": True, "left": True}
    )
    actions = plan(D, Observed(nodes, now=6.0))
    assert actions == [Terminate("n3", "preemption deadline passed"), Terminate("n4", "left the training job")]


def test_gone_node_closes_ledger_and_is_replaced() -> None:
    actions = plan(D, Observed(_nodes({}, {}, {"gone": True})))
    assert actions == [
        CloseLedger("n2", "the provider reports the VM gone"),
        Launch(1, "reach target 3; lost n2", lost=("n2",)),
    ]
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
    assert actions == [
        StopCluster("budget: spent 1.2000 $ >= max_total 1.0 $"),
        Drain("n0", "drain: budget max_total reached"),
        Terminate("n2", "budget max_total reached"),
    ]
    assert plan(desired, Observed(_nodes({"left": True, "leaving": True}), spent_total=1.2, stopped=True)) == [
        Terminate("n0", "budget max_total reached")
    ]


def test_unfinished_launch_is_resumed_with_its_key() -> None:
    actions = plan(D, Observed(_nodes({}), pending_launch=("k-1", 2, 0)))
    assert actions == [Launch(2, "resume an unfinished launch", key="k-1")]
    # One of its two VMs is already visible (and counted): nothing more is launched, nothing drained.
    actions = plan(D, Observed(_nodes({}, {}), pending_launch=("k-1", 2, 1)))
    assert actions == [Launch(2, "resume an unfinished launch", key="k-1")]


# --- warm spares ------------------------------------------------------------------------------
S = Desired(target=3, min=1, max=3, spares=1)


def test_spares_are_launched_besides_the_target_and_past_max() -> None:
    assert plan(S, Observed(_nodes({}, {}, {}))) == [Launch(1, "keep 1 warm spare", standby=1)]
    # A fresh cluster: the training nodes and the spare in one launch, the spare last.
    assert plan(S, Observed([])) == [Launch(4, "reach target 3", standby=1)]


def test_steady_state_with_a_spare_does_nothing() -> None:
    assert plan(S, Observed(_nodes({}, {}, {}, {"standby": True}))) == []


def test_notice_activates_the_spare_and_launches_a_new_one() -> None:
    nodes = _nodes({}, {}, {"noticed": True, "notice_deadline": 100.0}, {"standby": True})
    assert plan(S, Observed(nodes, now=50.0)) == [
        Activate("n3", "warm spare activated: replace noticed n2"),
        Launch(1, "keep 1 warm spare", standby=1),
    ]


def test_hard_kill_activates_an_alive_spare_before_a_booting_one() -> None:
    two = Desired(target=3, min=1, max=3, spares=2)
    nodes = _nodes(
        {},
        {},
        {"gone": True, "ledger_open": False},
        {"standby": True, "alive": False, "launched_at": 1.0},
        {"standby": True, "launched_at": 2.0},
    )
    assert plan(two, Observed(nodes)) == [
        Activate("n4", "warm spare activated: fill the target"),
        Launch(1, "keep 2 warm spares", standby=1),
    ]


def test_more_gaps_than_spares_launch_the_rest_for_training() -> None:
    nodes = _nodes({}, {"standby": True})
    assert plan(S, Observed(nodes)) == [
        Activate("n1", "warm spare activated: fill the target"),
        Launch(2, "reach target 3", standby=1),
    ]


def test_spares_no_longer_wanted_are_terminated_most_expensive_first() -> None:
    one = Desired(target=1, min=1, max=3, spares=1)
    nodes = _nodes({}, {"standby": True, "price_per_hour": 0.2}, {"standby": True})
    assert plan(one, Observed(nodes)) == [Terminate("n1", "spare not needed: nodes.spares is 1")]


def test_noticed_spare_is_not_activated_and_is_refilled() -> None:
    nodes = _nodes({}, {}, {}, {"standby": True, "noticed": True, "notice_deadline": 100.0})
    assert plan(S, Observed(nodes, now=1.0)) == [Launch(1, "keep 1 warm spare", standby=1)]


def test_budget_launches_training_nodes_before_spares() -> None:
    tight = Desired(target=3, min=1, max=3, spares=1, max_per_hour=0.35, launch_price=0.1)
    actions = plan(tight, Observed(_nodes({}, {})))
    assert actions[1] == Launch(1, "reach target 3")
    assert isinstance(actions[0], Blocked) and (actions[0].wanted, actions[0].allowed) == (2, 1)


def test_unfinished_launch_fills_the_target_before_the_spares() -> None:
    # 2 of 3 training nodes run; an unfinished launch of 2 (one for the target, one spare) shows none yet.
    actions = plan(S, Observed(_nodes({}, {}), pending_launch=("k-1", 2, 0)))
    assert actions == [Launch(2, "resume an unfinished launch", key="k-1")]


def test_a_finished_job_launches_nothing_and_lets_its_spares_go() -> None:
    nodes = _nodes({"finished": True}, {"finished": True}, {"gone": True}, {"standby": True})
    assert plan(S, Observed(nodes)) == [
        CloseLedger("n2", "the provider reports the VM gone"),
        Terminate("n3", "training finished: the spare is no longer needed"),
    ]
    # Without the finished report the same cluster would activate the spare and launch a new one.
    busy = _nodes({}, {}, {"gone": True}, {"standby": True})
    assert [type(a).__name__ for a in plan(S, Observed(busy))] == ["CloseLedger", "Activate", "Launch"]
