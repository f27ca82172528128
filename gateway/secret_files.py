"""Secrets Writ makes for itself on first use (the redaction salt, the dev issuer's key), made atomically.

Several processes may start at once on one shared volume (replicas, `writ serve` beside `writ token`).
The file is written whole under a temporary name and then linked into place, which fails if another
process got there first: a reader sees no file or a complete one, never a half-written one, and every
process ends up with the one secret that won.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path

logger = logging.getLogger(__name__)


def private_dir(path: Path) -> None:
    """Create `path` and any missing parents readable by their owner only (0700); existing ones stay.

    Raises:
        OSError: a directory cannot be created.
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            directory.mkdir(mode=0o700)


def create_once(path: Path, content: str, *, what: str) -> bool:
    """Create `path` (mode 0600) holding `content` unless it exists; True if this call created it.

    Said at WARNING, naming `what` was made and where: a replica whose secret was not mounted would
    otherwise make its own in silence (a salt its peers do not share, a checkpoint key added to the
    keys verify trusts), and only its first use on purpose is expected.

    Raises:
        OSError: the directory cannot be created or written.
    """
    private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        logger.warning("%s did not exist: made a new %s there (mode 0600)", path, what)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
