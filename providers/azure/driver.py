"""libcloud's Azure ARM driver, fixed for spotrun: endpoint override, login endpoint, real error codes.

What apache-libcloud 3.9.1 gets in the way of (besides the missing Spot fields and the broken
`ex_customdata`, which providers/azure.py avoids by sending its own VM body):
- the Azure AD token request always goes to `https://<login host>:443`, whatever the scheme or
  port of the cloud environment: our connection sends it to `login_url` as given;
- the ARM host cannot be moved to another scheme or port: `endpoint_url` sets both;
- an error answer becomes a LibcloudError whose text is "[Code] message": ours raise
  `AzureApiError` with the ARM error code and HTTP status, so callers can map capacity, quota
  and credential errors.

Authentication is the client-credentials flow (service principal) libcloud implements. Only
providers/azure.py imports this module, inside functions (libcloud loads lazily).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

from libcloud.common.azure_arm import AzureAuthJsonResponse, AzureJsonResponse, AzureResourceManagementConnection
from libcloud.compute.drivers.azure_arm import AzureNodeDriver

PUBLIC_LOGIN_URL = "https://login.microsoftonline.com"


class AzureApiError(Exception):
    """An ARM or Azure AD error answer: `code` is Azure's error code (e.g. SkuNotAvailable)."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


def _error(body: Any, status: int) -> AzureApiError:
    try:
        data = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return AzureApiError(str(err.get("code") or "UnknownError"), str(err.get("message") or ""), status)
    if isinstance(data, dict) and "error" in data:  # Azure AD: {"error": "invalid_client", ...}
        return AzureApiError(str(data["error"]), str(data.get("error_description") or "").split("\r\n")[0], status)
    return AzureApiError("UnknownError", f"HTTP {status}: {str(body)[:200]}", status)


class SpotrunAzureResponse(AzureJsonResponse):
    def parse_error(self) -> str:
        raise _error(self.body, self.status)


class SpotrunAzureAuthResponse(AzureAuthJsonResponse):
    def parse_error(self) -> str:
        raise _error(self.body, self.status)


class SpotrunAzureConnection(AzureResourceManagementConnection):
    responseCls = SpotrunAzureResponse

    def __init__(
        self,
        key: str,
        secret: str,
        *args: Any,  # libcloud's own (secure, tenant_id, ...), as the driver passes them
        endpoint_url: str | None = None,
        login_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(key, secret, *args, **kwargs)
        self.login_url = (login_url or PUBLIC_LOGIN_URL).rstrip("/")
        if endpoint_url:
            parts = urlsplit(endpoint_url)
            if not parts.hostname:
                raise ValueError(f"endpoint_url {endpoint_url!r} names no host")
            self.secure = parts.scheme != "http"
            self.host = parts.hostname
            self.port = parts.port or (443 if self.secure else 80)

    def get_token_from_credentials(self) -> None:
        """The client-credentials token request, sent to `login_url` (scheme and port kept)."""
        parts = urlsplit(self.login_url)
        secure = parts.scheme != "http"
        conn = self.conn_class(
            parts.hostname, parts.port or (443 if secure else 80), secure=secure, timeout=self.timeout
        )
        conn.connect()
        params = urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": self.user_id,
                "client_secret": self.key,
                "resource": self.login_resource,
            }
        )
        conn.request(
            "POST",
            f"{parts.path}/{self.tenant_id}/oauth2/token",
            params,
            {"Content-type": "application/x-www-form-urlencoded"},
        )
        token = SpotrunAzureAuthResponse(conn.getresponse(), conn).object  # an error answer raised in parse_error
        if not isinstance(token, dict):
            raise ValueError(f"the token answer from {self.login_url} is not a JSON object")
        self.access_token = token["access_token"]
        self.expires_on = token.get("expires_on") or int(time.time()) + int(token.get("expires_in", 3600))


class SpotrunAzureDriver(AzureNodeDriver):
    """AzureNodeDriver with the fixes in the module docstring. Connecting fetches a token."""

    connectionCls = SpotrunAzureConnection

    def __init__(
        self,
        tenant_id: str,
        subscription_id: str,
        client_id: str,
        client_secret: str,
        *,
        endpoint_url: str | None = None,
        login_url: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self._endpoint_url, self._login_url = endpoint_url, login_url
        super().__init__(tenant_id, subscription_id, client_id, client_secret, timeout=timeout)

    def _ex_connection_class_kwargs(self) -> dict[str, Any]:
        return {
            **super()._ex_connection_class_kwargs(),
            "endpoint_url": self._endpoint_url,
            "login_url": self._login_url,
        }

    def arm(self, method: str, path: str, api_version: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        """One ARM call: (status, parsed JSON or None, headers). Raises AzureApiError."""
        response = self.connection.request(path, params={"api-version": api_version}, method=method, data=body)
        return response.status, response.object or None, dict(response.headers or {})


__all__ = ["AzureApiError", "SpotrunAzureDriver"]
