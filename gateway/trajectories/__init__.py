"""Finished samples: the trajectory store (SQLite), its HTTP API and the client trainers use. It
knows nothing about sessions, turns or the engine."""
