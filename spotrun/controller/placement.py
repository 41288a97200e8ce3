"""From a recipe's resource candidates to providers and concrete offers, cheapest first."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotrun.errors import ProviderError

if TYPE_CHECKING:
    from spotrun.providers.base import Offer, Provider
    from spotrun.recipe.schema import Recipe, ResourceCandidate


@dataclass(frozen=True)
class Placement:
    """One candidate of the recipe resolved to a provider and its current offer."""

    index: int
    candidate: ResourceCandidate
    provider: Provider
    offer: Offer


def provider_config(candidate: ResourceCandidate) -> dict[str, Any]:
    """Constructor arguments for the candidate's provider: for one that takes its prices from the
    recipe (local), the recipe's price table entry and emulated boot time, if any."""
    from spotrun.providers import Feature, has_feature, provider_package

    if not has_feature(candidate.provider, Feature.RECIPE_PRICES) or (
        candidate.prices is None and candidate.boot_s is None
    ):
        return {}
    entry = dict(provider_package(candidate.provider).catalog.DEFAULT_PRICES.get(candidate.instance_type, {}))
    if candidate.prices is not None:
        gpus = candidate.accelerators.count if candidate.accelerators else 0
        entry = {"spot": candidate.prices.spot, "on_demand": candidate.prices.on_demand, "cpus": 2, "gpus": gpus}
    return {"prices": {candidate.instance_type: {**entry, "boot_s": candidate.boot_s or 0.0}}} if entry else {}


def provider_for(candidate: ResourceCandidate) -> Provider:
    from spotrun.providers import get_provider

    return get_provider(candidate.provider, **provider_config(candidate))


def providers_of(candidates: Iterable[ResourceCandidate]) -> list[Provider]:
    """One provider object per distinct provider of the candidates (configured by its first one),
    for finding their VMs."""
    seen: dict[str, Provider] = {}
    for candidate in candidates:
        seen.setdefault(candidate.provider, provider_for(candidate))
    return list(seen.values())


def provider_named(name: str, candidates: Iterable[ResourceCandidate]) -> Provider:
    """The provider `name`, configured by the first of the candidates that uses it, if any."""
    candidate = next((c for c in candidates if c.provider == name), None)
    if candidate is not None:
        return provider_for(candidate)
    from spotrun.providers import get_provider

    return get_provider(name)


def placements(recipe: Recipe) -> list[Placement]:
    """Every candidate with a matching offer, cheapest price paid first (recipe order breaks ties).

    Raises ProviderError when no candidate matches any offer, or all exceed their max_price.
    """
    found, problems = [], []
    for index, candidate in enumerate(recipe.resources):
        provider = provider_for(candidate)
        offer = _match(provider.offers(), candidate)
        if offer is None:
            problems.append(f"resources[{index}]: no {candidate.provider} offer for {candidate.instance_type}")
        elif candidate.max_price is not None and offer.price > candidate.max_price:
            problems.append(
                f"resources[{index}]: {offer.instance_type} costs {offer.price:.4f} $/h "
                f"> max_price {candidate.max_price}"
            )
        else:
            found.append(Placement(index, candidate, provider, offer))
    if not found:
        raise ProviderError(
            "no resource candidate has a usable offer: " + "; ".join(problems),
            hint="check instance types, zones and max_price in the recipe",
        )
    return sorted(found, key=lambda p: (p.offer.price, p.index))


def _match(offers: list[Offer], candidate: ResourceCandidate) -> Offer | None:
    for offer in offers:
        if (
            offer.instance_type == candidate.instance_type
            and offer.spot == candidate.spot
            and (candidate.zone is None or offer.zone == candidate.zone)
            and (candidate.region is None or offer.region == candidate.region)
        ):
            return offer
    return None
