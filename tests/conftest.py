"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import test_types

# pytest rewrites the asserts of every test module as it imports it (parse, rewrite, compile: about 7 s
# of CPU per process for the whole tree, in each of the three workers), and keeps the result beside the
# module (`__pycache__/*-pytest-*.pyc`, which git and the image's context ignore) only where bytecode may
# be written. This machine's environment sets PYTHONDONTWRITEBYTECODE, which would make every run and
# every worker rewrite the tree again; the processes the tests start still inherit it.
sys.dont_write_bytecode = False

pytest_plugins = ["tests.browser"]  # `browser` and `chromium`, for the console's and the sign-in pages' tests

POSTGRES_URL = os.environ.get("WRIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


MODULE_SECONDS = "writ/module-seconds"
"""The pytest cache's record of how long each module last ran (all its phases), read to order the next run."""


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


GUESSED_SECONDS = (1.0, 20.0, 60.0)
"""A module's length until a run measured it: in-process, real processes, a declared long timeout."""


@pytest.hookimpl(trylast=True)  # after pytest's own grouping of parametrized fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest modules first: scripts/test runs modules whole on 3 workers (--dist loadscope, with
    # --no-loadscope-reorder so that this order is the order they are handed out), and a long module
    # started last makes every other worker wait for it. The order is what the last run measured
    # (.pytest_cache); a module it did not run, or a fresh clone, goes by what the module says of
    # itself: a timeout over the default first (mypy, the benchmark, the fault campaigns, the image),
    # then real processes (`e2e`), then the rest. The sort is stable: a module's tests stay in order.
    cache = getattr(config, "cache", None)  # none with -p no:cacheprovider
    measured: dict[str, float] = cache.get(MODULE_SECONDS, {}) if cache else {}
    default_timeout = float(config.getini("timeout") or 0)
    said: dict[str, float] = {}
    for item in items:
        module = _module(item.nodeid)
        timeout = item.get_closest_marker("timeout")
        if timeout and timeout.args and float(timeout.args[0]) > default_timeout:
            guess = GUESSED_SECONDS[2]
        else:
            guess = GUESSED_SECONDS[1 if item.get_closest_marker("e2e") else 0]
        said[module] = max(said.get(module, 0.0), guess)
    seconds = {module: measured.get(module, guess) for module, guess in said.items()}
    items.sort(key=lambda item: seconds[_module(item.nodeid)], reverse=True)


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = _module(report.nodeid)
    _durations[module] = _durations.get(module, 0.0) + report.duration


def pytest_collection_finish(session: pytest.Session) -> None:
    # mypy runs for minutes with a cold cache: start it now, beside the other tests, not after them.
    # Under pytest-xdist every worker collects every test, and the other workers run beside mypy anyway:
    # there the test starts it when it is scheduled, so it runs once.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(item.path == Path(test_types.__file__) for item in session.items):
        test_types.mypy()


def pytest_sessionfinish(session: pytest.Session) -> None:
    test_types.stop_mypy()
    # The controller records (under pytest-xdist it hears every worker's reports); a worker does not.
    cache = getattr(session.config, "cache", None)
    if cache is not None and _durations and not os.environ.get("PYTEST_XDIST_WORKER"):
        cache.set(MODULE_SECONDS, {**cache.get(MODULE_SECONDS, {}), **_durations})


@pytest.fixture(scope="session")  # session-wide, so a module-scoped async fixture may use it (tests.browser)
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server the store suite runs against; the suite fails (not skips) when it is down."""
    return POSTGRES_URL
