"""How an EC2 VM hears of its spot interruption: the instance metadata service (IMDSv2).

A session token (`PUT /latest/api/token`, refreshed before it expires or on 401), then
`GET /latest/meta-data/spot/instance-action` every second: 404 until AWS schedules the
interruption, then `{"action": "terminate", "time": "<ISO 8601>"}`, the deadline.
Standard library only: the node agent on every VM imports this module (spotrun.node.notices).
"""

from __future__ import annotations

import json
import time
from datetime import datetime

from spotrun.providers.base import Fetch, NoticeSpec

BASE_URL = "http://169.254.169.254"
LEAD_S = 120.0  # AWS's "two-minute warning" (EC2 spot instance interruption notices)
TOKEN_TTL_S = 21600
_TOKEN_PATH = "/latest/api/token"
_ACTION_PATH = "/latest/meta-data/spot/instance-action"


class _Reader:
    """IMDSv2 for one watcher: holds the session token."""

    can_wait = False  # IMDS has no long poll

    def __init__(self, lead_s: float) -> None:
        del lead_s  # every notice carries its deadline
        self.token: str | None = None
        self._token_expiry = 0.0

    def poll(self, fetch: Fetch, *, wait_s: int = 0) -> tuple[float, str] | None:
        """See base.NoticeReader."""
        del wait_s  # never long-polls
        reply = fetch("GET", _ACTION_PATH, self._headers(fetch))
        if reply.status == 401:  # token expired or the endpoint restarted: fetch a new one next time
            self.token = None
            raise OSError("IMDSv2 token rejected")
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise OSError(f"instance-action answered {reply.status}")
        action = json.loads(reply.body)
        return datetime.fromisoformat(action["time"].replace("Z", "+00:00")).timestamp(), reply.body

    def _headers(self, fetch: Fetch) -> dict[str, str]:
        if self.token is None or time.monotonic() > self._token_expiry:
            reply = fetch("PUT", _TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            if reply.status != 200:
                raise OSError(f"IMDSv2 token request answered {reply.status}")
            # Refresh a minute early so a request never carries a token that expires in flight.
            self.token, self._token_expiry = reply.body.strip(), time.monotonic() + TOKEN_TTL_S - 60
        return {"X-aws-ec2-metadata-token": self.token}


# Polled every second: a notice is worth acting on at once.
PROTOCOL = NoticeSpec(base_url=BASE_URL, poll_interval_s=1.0, reader=_Reader)
