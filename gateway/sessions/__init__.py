"""Sessions: the session table and lifecycle, the journal that makes committed turns durable, and the
session routes (open, inspect, finish, delete). It knows nothing about any API surface."""
