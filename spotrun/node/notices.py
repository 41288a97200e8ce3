"""Watch a VM's metadata endpoint for a spot preemption notice (stdlib only).

The same code runs on a cloud VM and on a local VM, whose emulated endpoint
(`spotrun.providers.local.metadata`) speaks the real protocols:

- aws: IMDSv2 token (refreshed before it expires or on 401), `spot/instance-action` every 2 s.
- gcp: `instance/preempted`, long-polled with `wait_for_change` and `last_etag`. GCP gives no
  deadline; the VM stops about 30 s after the value turns TRUE, so the deadline is estimated.
- azure: Scheduled Events every 1 s; a `Preempt` event for this VM, deadline `NotBefore`.

Network and protocol errors never escape: `poll()` returns None and `wait()` keeps trying.
"""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from spotrun import log

_log = log.get("notices")

DEFAULT_BASE_URLS: dict[str, str] = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
POLL_INTERVAL_S: dict[str, float] = {
    "aws": 1.0,
    "gcp": 1.0,
    "azure": 1.0,
}  # every second: a notice is worth acting on at once
GCP_NOTICE_S = 30.0  # GCP's documented shutdown window after `preempted` turns TRUE
AWS_TOKEN_TTL_S = 21600
AZURE_API_VERSION = "2020-07-01"

# Metadata endpoints are link-local: a configured HTTP proxy must never see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class PreemptionNotice:
    """A notice as received: which protocol, when the VM dies (epoch s), when we heard, raw body."""

    source: str
    deadline: float
    received_at: float
    raw: str

    @property
    def seconds_left(self) -> float:
        return self.deadline - time.time()


@dataclass(frozen=True)
class _Reply:
    status: int
    body: str
    headers: dict[str, str]


class NoticeWatcher:
    """Polls one metadata endpoint in one protocol; `poll()` once or `wait()` until a notice.

    Not thread-safe: use one watcher per thread.
    """

    def __init__(
        self,
        protocol: str,
        base_url: str | None = None,
        *,
        timeout: float = 2.0,
        long_poll_s: int = 5,
        gcp_notice_s: float = GCP_NOTICE_S,
    ) -> None:
        """`base_url` defaults to the cloud's real endpoint; `long_poll_s` bounds one GCP
        wait_for_change request, and so how long `wait()` takes to notice its stop event."""
        if protocol not in DEFAULT_BASE_URLS:
            raise ValueError(f"notice protocol {protocol!r} is not one of {', '.join(DEFAULT_BASE_URLS)}")
        self.protocol = protocol
        self.base_url = (base_url or DEFAULT_BASE_URLS[protocol]).rstrip("/")
        self.timeout = timeout
        self.long_poll_s = long_poll_s
        self.gcp_notice_s = gcp_notice_s
        self._aws_token: str | None = None
        self._aws_token_expiry = 0.0
        self._gcp_etag: str | None = None
        self._azure_name: str | None = None

    @classmethod
    def from_env(cls) -> NoticeWatcher:
        """The watcher a VM's agent uses: SPOTRUN_NOTICE_PROTOCOL (default aws), SPOTRUN_METADATA_URL."""
        return cls(os.environ.get("SPOTRUN_NOTICE_PROTOCOL", "aws"), os.environ.get("SPOTRUN_METADATA_URL"))

    # -- public -------------------------------------------------------------------------------
    def poll(self) -> PreemptionNotice | None:
        """Ask once (non-blocking apart from the HTTP timeout). None: no notice, or unreachable."""
        try:
            return getattr(self, f"_poll_{self.protocol}")()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.debug("notice poll failed", extra=log.kv(protocol=self.protocol, error=exc))
            return None

    def wait(self, stop: threading.Event) -> PreemptionNotice | None:
        """Block until a notice arrives (returned) or `stop` is set (None), at the protocol's cadence."""
        while not stop.is_set():
            started = time.monotonic()
            long_poll = self.protocol == "gcp" and self._gcp_etag is not None
            notice = self._gcp_long_poll() if long_poll else self.poll()
            if notice is not None:
                return notice
            # A GCP long poll is itself the pause; after a plain poll (or an endpoint that answers
            # a long poll at once) wait the protocol's interval so we never spin.
            if self._gcp_etag is None or time.monotonic() - started < 0.5:
                stop.wait(POLL_INTERVAL_S[self.protocol])
        return None

    # -- HTTP ---------------------------------------------------------------------------------
    def _request(self, method: str, path: str, headers: dict[str, str], timeout: float | None = None) -> _Reply:
        """One request; HTTP error statuses come back as replies, network errors raise OSError."""
        req = urllib.request.Request(self.base_url + path, method=method, headers=headers)
        try:
            with _OPENER.open(req, timeout=timeout or self.timeout) as resp:
                return _Reply(resp.status, resp.read().decode(), dict(resp.headers.items()))
        except urllib.error.HTTPError as exc:
            with exc:
                return _Reply(exc.code, exc.read().decode(errors="replace"), dict(exc.headers.items()))

    def _notice(self, deadline: float, raw: str) -> PreemptionNotice:
        notice = PreemptionNotice(self.protocol, deadline, time.time(), raw)
        _log.info("preemption notice", extra=log.kv(protocol=self.protocol, seconds_left=round(notice.seconds_left, 1)))
        return notice

    # -- AWS ----------------------------------------------------------------------------------
    def _aws_headers(self) -> dict[str, str]:
        if self._aws_token is None or time.monotonic() > self._aws_token_expiry:
            reply = self._request(
                "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}
            )
            if reply.status != 200:
                raise OSError(f"IMDSv2 token request answered {reply.status}")
            # Refresh a minute early so a request never carries a token that expires in flight.
            self._aws_token, self._aws_token_expiry = reply.body.strip(), time.monotonic() + AWS_TOKEN_TTL_S - 60
        return {"X-aws-ec2-metadata-token": self._aws_token}

    def _poll_aws(self) -> PreemptionNotice | None:
        reply = self._request("GET", "/latest/meta-data/spot/instance-action", self._aws_headers())
        if reply.status == 401:  # token expired or the endpoint restarted: fetch a new one next time
            self._aws_token = None
            raise OSError("IMDSv2 token rejected")
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise OSError(f"instance-action answered {reply.status}")
        action = json.loads(reply.body)
        deadline = datetime.fromisoformat(action["time"].replace("Z", "+00:00")).timestamp()
        return self._notice(deadline, reply.body)

    # -- GCP ----------------------------------------------------------------------------------
    _GCP_PATH = "/computeMetadata/v1/instance/preempted"

    def _gcp_reply(self, reply: _Reply) -> PreemptionNotice | None:
        if reply.status != 200:
            raise OSError(f"preempted answered {reply.status}")
        self._gcp_etag = reply.headers.get("ETag") or reply.headers.get("Etag")
        if reply.body.strip().upper() != "TRUE":
            return None
        return self._notice(time.time() + self.gcp_notice_s, reply.body)

    def _poll_gcp(self) -> PreemptionNotice | None:
        return self._gcp_reply(self._request("GET", self._GCP_PATH, {"Metadata-Flavor": "Google"}))

    def _gcp_long_poll(self) -> PreemptionNotice | None:
        """One wait_for_change request; returns early when the value changes."""
        path = f"{self._GCP_PATH}?wait_for_change=true&last_etag={self._gcp_etag}&timeout_sec={self.long_poll_s}"
        try:
            return self._gcp_reply(
                self._request("GET", path, {"Metadata-Flavor": "Google"}, timeout=self.long_poll_s + self.timeout)
            )
        except (OSError, ValueError) as exc:
            _log.debug("notice long poll failed", extra=log.kv(protocol="gcp", error=exc))
            self._gcp_etag = None  # fall back to a plain poll after the usual pause
            return None

    # -- Azure --------------------------------------------------------------------------------
    def _azure_get(self, path: str, query: str = "") -> _Reply:
        return self._request("GET", f"{path}?api-version={AZURE_API_VERSION}{query}", {"Metadata": "true"})

    def _own_name(self) -> str | None:
        """This VM's name, to pick its events out of the document (best effort, cached)."""
        if self._azure_name is None:
            reply = self._azure_get("/metadata/instance/compute/name", "&format=text")
            if reply.status == 200 and reply.body.strip():
                self._azure_name = reply.body.strip()
        return self._azure_name

    def _poll_azure(self) -> PreemptionNotice | None:
        reply = self._azure_get("/metadata/scheduledevents")
        if reply.status != 200:
            raise OSError(f"scheduledevents answered {reply.status}")
        name = self._own_name()
        for event in json.loads(reply.body).get("Events", []):
            if _is_azure_preemption(event, name):
                # NotBefore is empty once the event has started: the VM may go any moment.
                not_before = event.get("NotBefore") or ""
                deadline = email.utils.parsedate_to_datetime(not_before).timestamp() if not_before else time.time()
                return self._notice(deadline, json.dumps(event))
        return None


def _is_azure_preemption(event: dict[str, Any], name: str | None) -> bool:
    if event.get("EventType") != "Preempt":
        return False
    return name is None or name in event.get("Resources", [])
