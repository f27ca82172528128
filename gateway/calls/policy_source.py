"""Where the policy in force comes from: the config's `policy:` section, or a file that is re-read when it
changes, so rules change without a restart.

The pipeline asks for the policy on every call (and the resume worker on every resume), and a
background task of the gateway every `interval_s`, so a change is loaded (or a bad file reported) when
it is made, not at the next call. A watched file is checked at most once per `interval_s` by its
modification time; a new file that does not load is logged and the policy in force stays. Each
decision carries the version of the policy that made it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from capabilities.contract import Capability
from policy.engine import Policy, load_policy_file
from policy.model import PolicyError
from policy.naming import tool_names, unmatched_tools
from policy.rules import PolicyConfig

logger = logging.getLogger(__name__)

PolicyProvider = Callable[[], Policy]
Vet = Callable[[Policy], None]
"""A check a policy must pass before it is put in force (raises PolicyError)."""


def vet_tool_names(policy: Policy, capabilities: Iterable[Capability]) -> None:
    """Refuse a policy whose deny or approval rule, budget or loop rule names a tool no capability
    has: a misspelled name covers no call, so a rule meant to hold refunds back would let them all
    through. Warn of the rest (a glob, or an allow rule, which fails closed): either may be written
    for tools an upstream has yet to offer.

    Raises:
        PolicyError: a plain name that holds calls back matches no tool name, capability id or ref.
    """
    unmatched = unmatched_tools(policy.config, tool_names(capabilities))
    refused = [u for u in unmatched if u.refuses_start]
    for entry in unmatched:
        if entry not in refused:
            logger.warning("policy %s: %s; it covers no call until one does", policy.version, entry)
    if refused:
        raise PolicyError(
            f"{'; '.join(map(str, refused))}: a misspelled name would cover no call and hold nothing "
            "back. Correct it, or write a glob (`refund_*`) for a tool an upstream has yet to offer"
        )


class WatchedPolicyFile:
    """The policy in a YAML file, reloaded when it changes: edited in place, or replaced by a rename."""

    def __init__(
        self,
        path: str | Path,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        vet: Vet | None = None,
    ):
        """Load the file now; `vet` checks each reloaded policy before it is put in force (the first is
        checked by whoever starts the gateway, once its upstreams' tools are known).

        Raises:
            PolicyError: the file cannot be read or holds an invalid policy.
        """
        self._path = Path(path)
        self._interval_s = interval_s
        self._clock = clock
        self._vet = vet
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._policy = load_policy_file(self._path)
        self._checked_at = clock()
        logger.info("policy %s loaded from %s", self._policy.version, self._path)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def interval_s(self) -> float:
        return self._interval_s

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
            if self._vet is not None:
                self._vet(policy)
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
    inline: PolicyConfig,
    policy_file: str | None,
    *,
    base_dir: Path,
    interval_s: float = 1.0,
    vet: Vet | None = None,
) -> PolicyProvider:
    """The policy in force: from `policy_file` (relative to the config's directory) if set, else inline;
    a reloaded file is put in force only if it passes `vet`.

    Raises:
        PolicyError: the policy does not load.
    """
    if policy_file is None:
        policy = Policy.from_config(inline)
        return lambda: policy
    path = Path(policy_file)
    return WatchedPolicyFile(path if path.is_absolute() else base_dir / path, interval_s=interval_s, vet=vet)
