"""The recording gateway: API surfaces, the turn lifecycle, sessions and their journal, the token
ledger, chat-template rendering, output parsing, the engine client, the trajectory store, its API
and the read-only viewer.

It depends on nothing of rlgw's but its own modules (see docs/ARCHITECTURE.md); it never trains,
runs agents or moves weights.
"""
