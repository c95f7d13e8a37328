"""Tenants and API keys: who is calling, compared in constant time, never logged.

A tenant owns the sessions it creates and the trajectories they produce; no route returns
another tenant's data. With no tenant keys configured the gateway runs open, as the single
tenant "default" (the one-machine default). Keys are never stored, only their SHA-256
digests, and are looked up by digest: lookup time does not depend on how much of a guessed
key is right (the point of constant-time comparison), without an O(keys) scan per request.
"""

from __future__ import annotations

import hashlib

from fastapi import HTTPException, Request

DEFAULT_TENANT = "default"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyTable:
    """Maps API keys to owners (a tenant name or a session id) without storing the keys."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, str] = {}

    def add(self, key: str, owner: str) -> None:
        """Register `key` as belonging to `owner`."""
        self._by_digest[_digest(key)] = owner

    def remove(self, key: str) -> None:
        """Forget `key` (no error if unknown)."""
        self._by_digest.pop(_digest(key), None)

    def owner(self, key: str) -> str | None:
        """The owner of `key`, or None."""
        # Keys are found by their SHA-256 digest: the lookup's timing depends on digest bytes,
        # which say nothing about how much of a guessed key is right, and it stays O(1) at any
        # number of sessions (comparing against every key would not).
        return self._by_digest.get(_digest(key))

    def __len__(self) -> int:
        return len(self._by_digest)


def bearer_key(request: Request) -> str | None:
    """The bearer token of the request (`Authorization: Bearer X`, `api-key: X`, or Anthropic's
    `x-api-key: X`), if any."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None


def require_tenant(request: Request) -> str:
    """FastAPI dependency: the calling tenant, or 401 in OpenAI's error format.

    Reads `request.app.state.tenant_keys` (a `KeyTable`); when it is empty the gateway is
    open and every caller is the default tenant.
    """
    table: KeyTable = request.app.state.tenant_keys
    if len(table) == 0:
        return DEFAULT_TENANT
    key = bearer_key(request)
    owner = table.owner(key) if key else None
    if owner is None:
        raise HTTPException(
            status_code=401,
            detail={
                "message": "Invalid or missing tenant API key.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            },
        )
    return owner
