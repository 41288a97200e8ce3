"""Watch a VM's metadata endpoint for a spot preemption notice.

The same code runs on a cloud VM and on a local VM, whose emulated endpoint
(`spotrun.providers.local.metadata`) speaks the real protocols. What each cloud's protocol
says (endpoint, headers, how a notice reads, its cadence) lives in that cloud's provider package
(`spotrun.providers.<cloud>.notices`, e.g. aws: IMDSv2 token and `spot/instance-action`; gcp:
long-polled `instance/preempted`; azure: Scheduled Events); this module does the HTTP, the
waiting and the error handling for all of them. It imports only the standard library and those
light modules, never a provider class or libcloud: the agent on every VM runs it.

Network and protocol errors never escape: `poll()` returns None and `wait()` keeps trying.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from spotrun import log
from spotrun.providers import DEFAULT_NOTICE_PROTOCOL, notice_protocols, provider_package
from spotrun.providers.base import HttpReply

_log = log.get("notices")

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
        lead_s: float | None = None,
    ) -> None:
        """`base_url` defaults to the cloud's real endpoint; `long_poll_s` bounds one long poll
        (GCP's wait_for_change), and so how long `wait()` takes to notice its stop event;
        `lead_s` is the lead time assumed where the protocol gives no deadline (default: the
        cloud's documented one). Raises ValueError for an unknown protocol."""
        known = notice_protocols()
        if protocol not in known:
            raise ValueError(f"notice protocol {protocol!r} is not one of {', '.join(known)}")
        notices = provider_package(protocol).notices
        self.protocol = protocol
        self.spec = notices.PROTOCOL
        self.base_url = (base_url or self.spec.base_url).rstrip("/")
        self.timeout = timeout
        self.long_poll_s = long_poll_s
        self.reader = self.spec.reader(notices.LEAD_S if lead_s is None else lead_s)

    @classmethod
    def from_env(cls) -> NoticeWatcher:
        """The watcher a VM's agent uses: SPOTRUN_NOTICE_PROTOCOL (default aws), SPOTRUN_METADATA_URL."""
        return cls(
            os.environ.get("SPOTRUN_NOTICE_PROTOCOL", DEFAULT_NOTICE_PROTOCOL), os.environ.get("SPOTRUN_METADATA_URL")
        )

    # -- public -------------------------------------------------------------------------------
    def poll(self) -> PreemptionNotice | None:
        """Ask once (non-blocking apart from the HTTP timeout). None: no notice, or unreachable."""
        return self._poll(wait_s=0)

    def wait(self, stop: threading.Event) -> PreemptionNotice | None:
        """Block until a notice arrives (returned) or `stop` is set (None), at the protocol's cadence."""
        while not stop.is_set():
            started = time.monotonic()
            notice = self._poll(wait_s=self.long_poll_s if self.reader.can_wait else 0)
            if notice is not None:
                return notice
            # A long poll is itself the pause; after a plain poll (or an endpoint that answers
            # a long poll at once) wait the protocol's interval so we never spin.
            if not self.reader.can_wait or time.monotonic() - started < 0.5:
                stop.wait(self.spec.poll_interval_s)
        return None

    # -- internals ----------------------------------------------------------------------------
    def _poll(self, wait_s: int) -> PreemptionNotice | None:
        try:
            found = self.reader.poll(self._fetch, wait_s=wait_s)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.debug("notice poll failed", extra=log.kv(protocol=self.protocol, error=exc))
            return None
        if found is None:
            return None
        notice = PreemptionNotice(self.protocol, found[0], time.time(), found[1])
        _log.info("preemption notice", extra=log.kv(protocol=self.protocol, seconds_left=round(notice.seconds_left, 1)))
        return notice

    def _fetch(self, method: str, path: str, headers: dict[str, str], wait_s: int = 0) -> HttpReply:
        """One request, `wait_s` longer than the timeout; HTTP error statuses come back as
        replies, network errors raise OSError (base.Fetch)."""
        req = urllib.request.Request(self.base_url + path, method=method, headers=headers)
        try:
            with _OPENER.open(req, timeout=self.timeout + wait_s) as resp:
                return HttpReply(resp.status, resp.read().decode(), dict(resp.headers.items()))
        except urllib.error.HTTPError as exc:
            with exc:
                return HttpReply(exc.code, exc.read().decode(errors="replace"), dict(exc.headers.items()))
