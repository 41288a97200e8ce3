"""What the local provider offers: its features and its default price table."""

from __future__ import annotations

from spotrun.providers.base import Feature

# Its VMs run on this machine: they reach the embedded etcd, take chaos schedules, and take their
# prices and boot time from the recipe.
FEATURES = frozenset({Feature.EMBEDDED_ETCD, Feature.CHAOS, Feature.RECIPE_PRICES})
ZONE_SUFFIX = None  # one region, one zone: local, local-a
# $/h per instance; made up but shaped like a cloud's, so costs flow through the same code.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "local-cpu-2": {"spot": 0.021, "on_demand": 0.085, "cpus": 2, "gpus": 0},
    "local-cpu-4": {"spot": 0.042, "on_demand": 0.17, "cpus": 4, "gpus": 0},
    "local-cpu-8": {"spot": 0.084, "on_demand": 0.34, "cpus": 8, "gpus": 0},
}
