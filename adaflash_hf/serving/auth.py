"""API-key authentication of the ``/v1/*`` routes, and the start-up warning for an exposed server without one.

With a key set, every request under ``/v1/`` must send ``Authorization: Bearer <key>``; the key is
compared in constant time (``hmac.compare_digest``). A missing or wrong key gets HTTP 401 with an
OpenAI-shaped error body before the request body is read. ``/health`` and ``/metrics`` stay open,
as in vLLM, so that load balancers and Prometheus need no secret (see docs/guides/deployment.md).
The check is a plain ASGI middleware, so streaming responses and disconnect detection pass through it
untouched.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging

logger = logging.getLogger(__name__)

PROTECTED_PREFIX = "/v1/"


def key_matches(header: bytes | None, api_key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``api_key`` as its bearer token (constant time)."""
    scheme, _, token = (header or b"").decode("latin-1").partition(" ")
    return hmac.compare_digest(token.strip().encode(), api_key.encode()) and scheme.lower() == "bearer"


class APIKeyMiddleware:
    """ASGI middleware: 401 for ``/v1/*`` requests without ``Authorization: Bearer <api_key>``.

    ``on_reject(path)`` is called for each refused request (the server counts refused generation requests).
    """

    def __init__(self, app, api_key: str, on_reject=None):
        if not api_key:
            raise ValueError("the API key is empty: pass a non-empty --api-key (or ADAFLASH_API_KEY), or none.")
        self.app, self.api_key, self.on_reject = app, api_key, on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization")
        if key_matches(header, self.api_key):
            return await self.app(scope, receive, send)
        if self.on_reject is not None:
            self.on_reject(scope["path"])
        message = (
            (
                "Missing API key: send it as 'Authorization: Bearer <key>' (the key this server was started "
                "with, --api-key or ADAFLASH_API_KEY)."
            )
            if header is None
            else (
                "Incorrect API key provided: send 'Authorization: Bearer <key>' with the key this server was "
                "started with."
            )
        )
        body = json.dumps(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) serves this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def warn_if_exposed(host: str, api_key: str | None) -> bool:
    """Log a warning (and return True) when ``host`` is reachable from other machines and no key is set."""
    if api_key or is_loopback(host):
        return False
    logger.warning(
        "serving on %s WITHOUT an API key: anyone who can reach this address can use the model. "
        "Start with --api-key (or set ADAFLASH_API_KEY), or bind 127.0.0.1 behind a proxy that "
        "authenticates.",
        host,
    )
    return True
