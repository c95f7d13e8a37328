"""Fresh ids for engine requests, responses and tool calls: unique, cheap, and not secret; and
the seeds derived from a session's seed.

`uuid4` reads the OS's random source on every call: 14 us of a turn here (three ids per turn,
measured under bench/gateway.py's loop, where caches are cold). These ids need to be unique,
not unguessable (a session's id and key, which are capabilities, still come from `uuid4` and
`secrets`): 64 random bits drawn once per process, then a counter. A forked child draws its own.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets


def _reseed() -> None:
    global _prefix, _counter
    _prefix = secrets.token_hex(8)
    _counter = itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def fresh_hex(counter_digits: int = 16) -> str:
    """16 hex digits fixed for this process, then the next count in `counter_digits` hex digits."""
    return f"{_prefix}{next(_counter) % (1 << 4 * counter_digits):0{counter_digits}x}"


def derived_seed(seed: int, part: int | str) -> int:
    """A sampling seed fixed by (`seed`, `part`) and unrelated to its neighbours' (63 bits, so every
    engine takes it): a session's turn k, or a training run's attempt named `part`."""
    digest = hashlib.blake2b(f"{seed}:{part}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
