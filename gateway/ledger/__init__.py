"""The token ledger: a session's token-exact series (ids, logprobs, loss mask, weight versions) and
its segments. It knows nothing about HTTP, templates or the engine's wire format."""
