"""The embedded engine: SGLang's native HTTP protocol on CPU with `transformers`, in rooms
(request, scheduler, runner, weights, grammar, server).

The default engine when no SGLang URL is given, and the one every test runs against. It shares
only the checkpoint and version format with `rlgw.sync`; it knows nothing about sessions, chat
templates or ledgers (it sees token ids).
"""
