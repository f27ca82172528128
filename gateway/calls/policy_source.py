"""Where the policy in force comes from: the config's `policy:` section, or a file that is re-read when it
changes, so rules change without a restart.

The pipeline asks for the policy on every call (and the resume worker on every resume). A watched file
is checked at most once per `interval_s` by its modification time; a new file that does not load is
logged and the policy in force stays. Each decision carries the version of the policy that made it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from policy.engine import Policy, load_policy_file
from policy.model import PolicyError
from policy.rules import PolicyConfig

logger = logging.getLogger(__name__)

PolicyProvider = Callable[[], Policy]


class WatchedPolicyFile:
    """The policy in a YAML file, reloaded when it changes: edited in place, or replaced by a rename."""

    def __init__(
        self, path: str | Path, *, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ):
        """Load the file now.

        Raises:
            PolicyError: the file cannot be read or holds an invalid policy.
        """
        self._path = Path(path)
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._policy = load_policy_file(self._path)
        self._checked_at = clock()
        logger.info("policy %s loaded from %s", self._policy.version, self._path)

    @property
    def path(self) -> Path:
        return self._path

    def __call__(self) -> Policy:
        if self._clock() - self._checked_at < self._interval_s:
            return self._policy
        with self._lock:
            if self._clock() - self._checked_at >= self._interval_s:
                self._checked_at = self._clock()
                self._reload_if_changed()
        return self._policy

    def _reload_if_changed(self) -> None:
        try:
            stamp = self._stat()
        except PolicyError as exc:
            if self._stamp is not None:
                logger.error("%s; keeping policy %s", exc, self._policy.version)
            self._stamp = None
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp  # a bad file is reported once, not every second
        try:
            policy = load_policy_file(self._path)
        except PolicyError as exc:
            logger.error(
                "policy file %s not loaded, keeping policy %s: %s", self._path, self._policy.version, exc
            )
            return
        if policy.version != self._policy.version:
            logger.info("policy reloaded from %s: %s -> %s", self._path, self._policy.version, policy.version)
        self._policy = policy

    def _stat(self) -> tuple[int, ...] | None:
        try:
            stat = os.stat(self._path)
        except OSError as exc:
            raise PolicyError(f"cannot read policy file {self._path}: {exc.strerror}") from exc
        # mtime and size alone missed a file of the same size renamed over it with its mtime kept
        # (rsync -a, cp -p, a tarball): a new threshold, `> 100` to `> 500`, never took effect. A
        # rename brings another inode and sets ctime, which no tool can set back.
        return stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size


def policy_provider(
    inline: PolicyConfig, policy_file: str | None, *, base_dir: Path, interval_s: float = 1.0
) -> PolicyProvider:
    """The policy in force: from `policy_file` (relative to the config's directory) if set, else inline.

    Raises:
        PolicyError: the policy does not load.
    """
    if policy_file is None:
        policy = Policy.from_config(inline)
        return lambda: policy
    path = Path(policy_file)
    return WatchedPolicyFile(path if path.is_absolute() else base_dir / path, interval_s=interval_s)
