"""What AWS offers: its features, zone names, and the EC2 instance types spotrun offers by default
(vCPUs, GPUs and a fallback on-demand list price).

On-demand prices come from libcloud's pricing data per region when it has them (it returns 0.0
for many GPU types in some regions); the `list_price` here (us-east-1 Linux, USD/h) fills the gap.
Spot prices are always live (DescribeSpotPriceHistory). Extend with `AwsProvider(instance_types=...)`.
"""

from __future__ import annotations

from typing import NamedTuple

from spotrun.providers.base import Feature

FEATURES = frozenset({Feature.HEAD_VM})
ZONE_SUFFIX = "a"  # us-east-1 -> us-east-1a


class InstanceShape(NamedTuple):
    cpus: int
    gpus: int
    gpu_name: str | None
    list_price: float


CATALOG: dict[str, InstanceShape] = {
    "p5.48xlarge": InstanceShape(192, 8, "H100", 98.32),
    "p4d.24xlarge": InstanceShape(96, 8, "A100", 32.7726),
    "p4de.24xlarge": InstanceShape(96, 8, "A100-80GB", 40.9657),
    "p3.2xlarge": InstanceShape(8, 1, "V100", 3.06),
    "p3.8xlarge": InstanceShape(32, 4, "V100", 12.24),
    "p3.16xlarge": InstanceShape(64, 8, "V100", 24.48),
    "g5.xlarge": InstanceShape(4, 1, "A10G", 1.006),
    "g5.2xlarge": InstanceShape(8, 1, "A10G", 1.212),
    "g5.12xlarge": InstanceShape(48, 4, "A10G", 5.672),
    "g5.48xlarge": InstanceShape(192, 8, "A10G", 16.288),
    "g6.xlarge": InstanceShape(4, 1, "L4", 0.8048),
    "g6.12xlarge": InstanceShape(48, 4, "L4", 4.6016),
    "g4dn.xlarge": InstanceShape(4, 1, "T4", 0.526),
    "g4dn.12xlarge": InstanceShape(48, 4, "T4", 3.912),
    "t3.small": InstanceShape(2, 0, None, 0.0208),  # head VMs (etcd + controller)
    "t3.medium": InstanceShape(2, 0, None, 0.0416),
    "m5.large": InstanceShape(2, 0, None, 0.096),
    "c5.xlarge": InstanceShape(4, 0, None, 0.17),
}


def on_demand_price(instance_type: str, region: str, shape: InstanceShape) -> float:
    """libcloud's on-demand Linux price for the region, else the catalog's list price."""
    from libcloud.pricing import get_size_price

    try:
        price = get_size_price("compute", "ec2_linux", instance_type, region)
    except (KeyError, ValueError, TypeError):
        price = None
    return float(price) if price else shape.list_price
