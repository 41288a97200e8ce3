"""Local VMs have no notice protocol of their own: each VM's emulated metadata endpoint
(metadata.py) speaks the clouds' protocols, in the dialect the provider was built with
(`LocalProvider(notice_protocol=...)`)."""

from __future__ import annotations

from spotrun.providers.base import NoticeSpec

# Chosen per injection; 30 s is the recipe's chaos default (spotrun.recipe.schema.Preemption.notice).
LEAD_S = 30.0
PROTOCOL: NoticeSpec | None = None
