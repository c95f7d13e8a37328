"""Tenants and API keys: who is calling, compared in constant time, never logged.

A tenant owns the sessions it creates and the trajectories they produce; no route returns
another tenant's data. With no tenant keys configured the gateway runs open, as the single
tenant "default" (the one-machine default). Keys are never stored, only their SHA-256
digests, and are looked up by digest: lookup time does not depend on how much of a guessed
key is right (the point of constant-time comparison), without an O(keys) scan per request.

Tenant keys come from two places: the configuration (`RLGW_TENANT_KEYS`, `--tenant-keys-file`;
fixed for the process) and the admin-managed tenant store (`store.py`; replaced whenever
it changes). The admin key, when set, only manages tenants; it is no tenant's key.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import HTTPException, Request

from rlgw.gateway.errors import AuthError

DEFAULT_TENANT = "default"


def key_digest(key: str) -> bytes:
    """The SHA-256 digest a key is stored and looked up by."""
    return hashlib.sha256(key.encode()).digest()


_digest = key_digest


class KeyTable:
    """Maps API keys to owners (a tenant name or a session id) without storing the keys.

    Used for session keys (`sessions.SessionTable`) and for tenant keys (`app.state.tenant_keys`,
    which also holds the admin key's digest and the stored tenants' digests).
    """

    def __init__(self) -> None:
        self._by_digest: dict[bytes, str] = {}
        self._stored: dict[bytes, str] = {}  # the tenant store's digests, replaced as a whole
        self._admin: bytes | None = None

    def add(self, key: str, owner: str) -> None:
        """Register `key` as belonging to `owner`."""
        self._by_digest[_digest(key)] = owner

    def remove(self, key: str) -> None:
        """Forget `key` (no error if unknown)."""
        self._by_digest.pop(_digest(key), None)

    def add_digest(self, digest: bytes, owner: str) -> None:
        """Register a key known only by its digest (a session restored from the journal)."""
        self._by_digest[digest] = owner

    def remove_digest(self, digest: bytes) -> None:
        """Forget the key whose digest is `digest` (no error if unknown)."""
        self._by_digest.pop(digest, None)

    def owner(self, key: str) -> str | None:
        """The owner of `key`, or None."""
        # Keys are found by their SHA-256 digest: the lookup's timing depends on digest bytes,
        # which say nothing about how much of a guessed key is right, and it stays O(1) at any
        # number of sessions (comparing against every key would not).
        d = _digest(key)
        return self._by_digest.get(d) or self._stored.get(d)

    def replace_stored(self, digests: dict[bytes, str]) -> None:
        """Set the tenant store's keys (digest -> tenant), dropping the previous set."""
        self._stored = dict(digests)

    def set_admin_key(self, key: str | None) -> None:
        """The key that manages tenants (None: the admin API refuses everyone)."""
        self._admin = _digest(key) if key else None

    def is_admin_required(self) -> bool:
        """Whether an admin key is set (then operations routes such as `/metrics` need it)."""
        return self._admin is not None

    def is_admin(self, key: str | None) -> bool:
        """Whether `key` is the admin key (digests compared in constant time)."""
        if self._admin is None or not key:
            return False
        return hmac.compare_digest(_digest(key), self._admin)

    def __len__(self) -> int:
        """How many credentials guard the gateway (keys, and the admin key when set).

        0 means the gateway is open: every caller is the default tenant. Setting an admin key
        closes it even before the first tenant is added.
        """
        return len(self._by_digest) + len(self._stored) + (self._admin is not None)


def bearer_key(request: Request) -> str | None:
    """The bearer token of the request (`Authorization: Bearer X`, `api-key: X`, Anthropic's
    `x-api-key: X`, or Gemini's `x-goog-api-key: X`, or `?key=X` on Gemini's routes), if any."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    headers = request.headers
    key = headers.get("api-key") or headers.get("x-api-key") or headers.get("x-goog-api-key")
    if not key and request.scope.get("query_string") and ":" in request.url.path.rsplit("/", 1)[-1]:
        # Gemini's clients may send it in the query instead; only its `models/{model}:method` routes take it
        # there, so no other route's key ends up in a URL a proxy logs.
        key = request.query_params.get("key")
    return key or None


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


def require_admin(request: Request) -> None:
    """FastAPI dependency: 401 unless the bearer token is the admin key.

    The answer is the same whether no admin key is configured or a wrong one was sent.
    """
    if not request.app.state.tenant_keys.is_admin(bearer_key(request)):
        raise AuthError("Invalid or missing admin API key.")
