"""Tenants: keys and their registry, the tenant store, per-tenant limits and the admin routes. It
knows nothing about sessions, turns or surfaces."""
