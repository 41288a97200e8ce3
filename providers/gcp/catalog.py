"""What GCP offers: its features, zone names, and the machine types spotrun offers.

Prices are not here: libcloud's static per-vCPU/per-GiB rates for the CPU families and the Cloud
Billing Catalog for the GPU families (api.py: family_price, catalog_price).
"""

from __future__ import annotations

from spotrun.providers.base import Feature

FEATURES = frozenset({Feature.HEAD_VM})
ZONE_SUFFIX = "-a"  # us-central1 -> us-central1-a

# (vCPUs, memory GiB, GPUs, GPU name) of machine types spotrun offers on GCP.
MACHINE_TYPES: dict[str, tuple[int, float, int, str | None]] = {
    "n1-standard-4": (4, 15.0, 0, None),
    "n1-standard-8": (8, 30.0, 0, None),
    "n1-standard-16": (16, 60.0, 0, None),
    "n2-standard-8": (8, 32.0, 0, None),
    "e2-standard-4": (4, 16.0, 0, None),
    "c2-standard-8": (8, 32.0, 0, None),
    "a2-highgpu-1g": (12, 85.0, 1, "A100"),
    "a2-highgpu-8g": (96, 680.0, 8, "A100"),
    "g2-standard-4": (4, 16.0, 1, "L4"),
    "g2-standard-48": (48, 192.0, 4, "L4"),
}
