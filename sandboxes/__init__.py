"""Sandboxes that run an agent's commands: the `Sandbox` protocol, a local backend (subprocesses,
optional bubblewrap) and ROCK (its HTTP API, with long commands run detached and polled).

They know nothing about agents, sessions or the gateway: they run commands and move files.
"""
