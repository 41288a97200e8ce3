"""How a GCE Spot VM hears of its preemption: the metadata server's `instance/preempted`.

`GET /computeMetadata/v1/instance/preempted` (header `Metadata-Flavor: Google`) answers FALSE
until Google preempts the VM, then TRUE; after the first answer it is long-polled with
`wait_for_change` and `last_etag`. GCP gives no deadline: the VM stops about `LEAD_S` after the
value turns TRUE, so the deadline is estimated.
Standard library only: the node agent on every VM imports this module (spotrun.node.notices).
"""

from __future__ import annotations

import time

from spotrun.providers.base import Fetch, HttpReply, NoticeSpec

BASE_URL = "http://metadata.google.internal"
LEAD_S = 30.0  # GCP's documented shutdown window after `preempted` turns TRUE (ACPI G2 soft off)
_PATH = "/computeMetadata/v1/instance/preempted"
_HEADERS = {"Metadata-Flavor": "Google"}


class _Reader:
    """`preempted` for one watcher: holds the value's ETag, which enables long polls."""

    def __init__(self, lead_s: float) -> None:
        self.lead_s = lead_s
        self._etag: str | None = None

    @property
    def can_wait(self) -> bool:
        return self._etag is not None

    def poll(self, fetch: Fetch, *, wait_s: int = 0) -> tuple[float, str] | None:
        """See base.NoticeReader; a long poll returns early when the value changes."""
        if not (wait_s and self.can_wait):
            return self._read(fetch("GET", _PATH, _HEADERS))
        path = f"{_PATH}?wait_for_change=true&last_etag={self._etag}&timeout_sec={wait_s}"
        try:
            return self._read(fetch("GET", path, _HEADERS, wait_s=wait_s))
        except (OSError, ValueError):
            self._etag = None  # fall back to a plain poll after the usual pause
            raise

    def _read(self, reply: HttpReply) -> tuple[float, str] | None:
        if reply.status != 200:
            raise OSError(f"preempted answered {reply.status}")
        self._etag = reply.headers.get("ETag") or reply.headers.get("Etag")
        if reply.body.strip().upper() != "TRUE":
            return None
        return time.time() + self.lead_s, reply.body


# Polled every second until the first answer gives an ETag; long polls after that.
PROTOCOL = NoticeSpec(base_url=BASE_URL, poll_interval_s=1.0, reader=_Reader)
