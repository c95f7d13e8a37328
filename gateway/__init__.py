"""The recording gateway: OpenAI surface, sessions, token ledger, trajectory store.

Depends on nothing of rlgw's but its own modules (see docs/ARCHITECTURE.md).
"""
