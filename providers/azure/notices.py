"""How an Azure Spot VM hears of its eviction: Scheduled Events in the instance metadata service.

`GET /metadata/scheduledevents?api-version=...` (header `Metadata: true`) every second; a
`Preempt` event naming this VM (its compute name, read once) is the notice, its `NotBefore` the
deadline (empty once the event has started: the VM may go any moment).
Standard library only: the node agent on every VM imports this module (spotrun.node.notices).
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

from spotrun.providers.base import Fetch, HttpReply, NoticeSpec

BASE_URL = "http://169.254.169.254"
LEAD_S = 30.0  # Azure Scheduled Events: "minimum 30 seconds" for spot evictions
API_VERSION = "2020-07-01"


class _Reader:
    """Scheduled Events for one watcher: holds the VM's compute name once known."""

    can_wait = False  # Scheduled Events has no long poll

    def __init__(self, lead_s: float) -> None:
        del lead_s  # every notice carries its deadline
        self.vm_name: str | None = None

    def poll(self, fetch: Fetch, *, wait_s: int = 0) -> tuple[float, str] | None:
        """See base.NoticeReader."""
        del wait_s  # never long-polls
        reply = _get(fetch, "/metadata/scheduledevents")
        if reply.status != 200:
            raise OSError(f"scheduledevents answered {reply.status}")
        name = self._own_name(fetch)
        for event in json.loads(reply.body).get("Events", []):
            if _is_preemption(event, name):
                not_before = event.get("NotBefore") or ""
                deadline = email.utils.parsedate_to_datetime(not_before).timestamp() if not_before else time.time()
                return deadline, json.dumps(event)
        return None

    def _own_name(self, fetch: Fetch) -> str | None:
        """This VM's name, to pick its events out of the document (best effort, cached)."""
        if self.vm_name is None:
            reply = _get(fetch, "/metadata/instance/compute/name", "&format=text")
            if reply.status == 200 and reply.body.strip():
                self.vm_name = reply.body.strip()
        return self.vm_name


def _get(fetch: Fetch, path: str, query: str = "") -> HttpReply:
    return fetch("GET", f"{path}?api-version={API_VERSION}{query}", {"Metadata": "true"})


def _is_preemption(event: dict[str, Any], name: str | None) -> bool:
    if event.get("EventType") != "Preempt":
        return False
    return name is None or name in event.get("Resources", [])


# Polled every second: a notice is worth acting on at once.
PROTOCOL = NoticeSpec(base_url=BASE_URL, poll_interval_s=1.0, reader=_Reader)
