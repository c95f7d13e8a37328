"""Headless Chromium for the viewer's browser tests and bench: Debian's `chromium` driven by Playwright.

Playwright's own browser download is not used (no network in CI); Debian's package is. The flags
keep Chromium from reaching out (updates, sync, QUIC) and let it run as root in a container.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """The system Chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the dev extra)"
    if chromium_path() is None:
        return "no chromium executable (apt-get install chromium)"
    return None


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A launched headless Chromium (a Playwright `Browser`), closed at the end of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
