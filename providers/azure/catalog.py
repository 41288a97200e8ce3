"""What Azure offers: its features, zone names, and the VM sizes spotrun offers (prices are live,
from the Retail Prices API: api.py)."""

from __future__ import annotations

from spotrun.providers.base import Feature

FEATURES = frozenset({Feature.HEAD_VM})
ZONE_SUFFIX = None  # Azure's zones are "1", "2", "3" within a region

# (vCPUs, GPUs, GPU name) of the VM sizes spotrun offers on Azure.
VM_SIZES: dict[str, tuple[int, int, str | None]] = {
    "Standard_NC4as_T4_v3": (4, 1, "T4"),
    "Standard_NC6s_v3": (6, 1, "V100"),
    "Standard_NC12s_v3": (12, 2, "V100"),
    "Standard_NC24s_v3": (24, 4, "V100"),
    "Standard_NC24ads_A100_v4": (24, 1, "A100"),
    "Standard_ND96asr_v4": (96, 8, "A100"),
    "Standard_D8s_v5": (8, 0, None),
    "Standard_F16s_v2": (16, 0, None),
}
