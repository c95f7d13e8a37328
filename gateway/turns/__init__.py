"""The turn: one lifecycle (lock, commit, settling) and the message turn every message surface
translates into. It knows no request or response shapes and no HTTP."""
