"""spotrun.state.schema: the key layout, taken apart and put together (no etcd)."""

from __future__ import annotations

import pytest

from spotrun.state import schema
from spotrun.state.schema import ChaosMark, Kind, ParsedKey, RdzvKey, RdzvPart


def test_keys_of_one_cluster() -> None:
    assert schema.cluster_prefix("c") == "/spotrun/c/"
    assert schema.key("c", Kind.SPEC) == "/spotrun/c/spec"
    assert schema.key("c", Kind.NODES, "n1") == "/spotrun/c/nodes/n1"
    assert schema.key("c", Kind.EVENTS, 7) == "/spotrun/c/events/000000000007"  # lexical order is numeric order
    assert schema.kind_prefix("c", Kind.ALIVE) == "/spotrun/c/alive/"
    assert schema.chaos_start_key("c") == "/spotrun/c/chaos/start"
    assert schema.chaos_key("c", ChaosMark.SCHEDULE, 2) == "/spotrun/c/chaos/fired-2"
    assert schema.chaos_key("c", ChaosMark.TRACE, 0) == "/spotrun/c/chaos/trace-0"


def test_rendezvous_keys() -> None:
    assert schema.rdzv_prefix("c", "run") == "/spotrun/c/rdzv/run/"
    assert schema.rdzv_state_key("c", "run") == "/spotrun/c/rdzv/run/state"
    assert schema.rdzv_key("c", "run", RdzvPart.ALIVE) == "/spotrun/c/rdzv/run/alive/"
    assert schema.rdzv_key("c", "run", RdzvPart.WAITING, "n4") == "/spotrun/c/rdzv/run/waiting/n4"
    assert schema.rdzv_key("c", "run", RdzvPart.STORE) == "/spotrun/c/rdzv/run/store/"


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", "-x", "x" * 129])
def test_names_that_could_escape_their_prefix_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="must be 1-128"):
        schema.key("c", Kind.NODES, bad)
    with pytest.raises(ValueError, match="cluster"):
        schema.cluster_prefix(bad)


def test_parse_key_round_trips_every_kind() -> None:
    for kind in Kind:
        assert schema.parse_key("c", schema.key("c", kind)) == ParsedKey(kind)
        assert schema.parse_key("c", schema.key("c", kind, "n1")) == ParsedKey(kind, "n1")
    assert schema.parse_key("c", "/spotrun/c-x/nodes/n1") is None  # another cluster sharing a prefix
    assert schema.parse_key("c", "/spotrun/c/newer-kind/x") is None
    assert schema.parse_key("c", "/elsewhere") is None


def test_parse_rdzv_key() -> None:
    assert schema.parse_rdzv_key("c", schema.rdzv_key("c", "c", RdzvPart.ALIVE, "n1")) == RdzvKey("c", "alive", "n1")
    assert schema.parse_rdzv_key("c", schema.rdzv_state_key("c", "r")) == RdzvKey("r", "state")
    assert schema.parse_rdzv_key("c", schema.rdzv_key("c", "r", RdzvPart.STORE, "a/b")) == RdzvKey("r", "store", "a/b")
    assert schema.parse_rdzv_key("c", schema.key("c", Kind.ALIVE, "n1")) is None


def test_cluster_of() -> None:
    assert schema.cluster_of(schema.key("llm", Kind.TARGET)) == "llm"
    assert schema.cluster_of("/other/llm/target") is None


def test_history_kinds() -> None:
    """What `spotrun down` keeps: what the cluster was, ran and cost."""
    assert {k for k in Kind if k.is_history} == {Kind.SPEC, Kind.CHECKPOINTS, Kind.LEDGER, Kind.EVENTS}
