"""libcloud's GCE driver with an endpoint override that also moves the OAuth2 token exchange.

libcloud 3.9.1 cannot point its GCE driver anywhere but www.googleapis.com and
accounts.google.com: passing `host=` to GCENodeDriver lands in the wrong positional argument of
GCEConnection. This subclass takes `endpoint_url` instead and hands host, port and scheme to both
the Compute connection and the service-account auth connection (which receives the same keyword
arguments), so a test server, or a private endpoint, sees the real JWT-bearer token request and
the real API calls. Authentication is always service account ("SA"): no probing of the GCE
metadata server. Without `endpoint_url` nothing changes. Only providers/gcp/provider.py imports this
module, inside functions (libcloud loads lazily).
"""

from __future__ import annotations

from typing import Any

from libcloud.compute.drivers.gce import GCEConnection, GCENodeDriver
from spotrun.providers.gcp.api import COMPUTE_SCOPES, endpoint_parts


class SpotrunGCEConnection(GCEConnection):
    def __init__(
        self,
        user_id: str,
        key: str,
        secure: bool,
        auth_type: Any = None,
        credential_file: Any = None,
        project: Any = None,
        endpoint_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        if endpoint_url:
            host, port, secure = endpoint_parts(endpoint_url)
            kwargs.update(host=host, port=port)
        super().__init__(
            user_id, key, secure, auth_type=auth_type, credential_file=credential_file, project=project, **kwargs
        )


class SpotrunGCEDriver(GCENodeDriver):
    """GCENodeDriver authenticated with a service account, optionally at `endpoint_url`."""

    connectionCls = SpotrunGCEConnection
    connection: SpotrunGCEConnection  # what connectionCls builds (libcloud declares a plain Connection)

    def __init__(
        self,
        client_email: str,
        private_key: str,
        *,
        project: str,
        credential_file: str,
        endpoint_url: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self._endpoint_url = endpoint_url
        super().__init__(
            client_email,
            private_key,
            project=project,
            auth_type="SA",
            scopes=COMPUTE_SCOPES,
            credential_file=credential_file,
            timeout=timeout,
        )

    def _ex_connection_class_kwargs(self) -> dict[str, Any]:
        return {**super()._ex_connection_class_kwargs(), "endpoint_url": self._endpoint_url}
