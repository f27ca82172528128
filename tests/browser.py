"""Debian's Chromium, driven by Playwright, for the console's and the sign-in pages' tests.

The suite launched the browser, and Playwright's driver beside it, once per browser test: about 11 s
of the ten browser modules' 111 s of CPU. One browser now serves a whole module (`chromium`), and
each test gets it through `browser`, which closes every context the test opened when it ends, so no
page of one test (its cookies, its storage, a console still refreshing) outlives it. A test opens its
own context (`browser.new_context()`), as Playwright's own fixtures do: contexts share nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Browser]:
    """The module's browser (its tests share the module's event loop with it)."""
    assert CHROMIUM.exists(), "the browser tests need Debian's chromium (apt-get install chromium)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def browser(chromium: Browser) -> AsyncIterator[Browser]:
    """The module's browser for one test; the contexts the test opened are closed after it."""
    try:
        yield chromium
    finally:
        for context in chromium.contexts:  # only this test's: each test's are closed after it
            await context.close()
