"""The authorization server's signing keys: ES256, each with a `kid`, kept in one file.

The file is a JSON object `{"keys": [private JWK, ...]}`, newest first. The first key signs; every key
is published in /jwks.json and verifies. Rotating puts a new key first and keeps the old ones, so the
tokens they signed keep verifying until they expire; keys older than that are dropped at the next
rotation. Every replica reads the same file (a shared secret, like the checkpoint key).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, KeySet

from gateway.errors import ConfigurationError
from gateway.secret_files import create_once

ALGORITHM = "ES256"
CREATED = "writ_created_at"
"""A member of each stored JWK: when it was made (seconds since the epoch), to know when it may go."""


class SigningKeys:
    """The keys of one file: `sign` with the newest, `public_keys`/`jwks` for every one."""

    def __init__(self, keys: list[ECKey], created: list[float]) -> None:
        if not keys:
            raise ValueError("a key set needs at least one key")
        self._keys = keys
        self._created = created

    @classmethod
    def load_or_create(cls, path: str | Path) -> SigningKeys:
        """Read the key file, creating it (mode 0600) with one key on first use.

        Raises:
            ConfigurationError: the file is not a key set this server can sign with.
        """
        path = Path(path)
        if not path.exists():
            # Or another process's wins.
            keys = json.dumps({"keys": [_new_key(time.time())]})
            create_once(path, keys, what="authorization server key set")
        return cls._read(path)

    @classmethod
    def _read(cls, path: Path) -> SigningKeys:
        try:
            stored = json.loads(path.read_text())["keys"]
            keys = [ECKey.import_key({k: v for k, v in entry.items() if k != CREATED}) for entry in stored]
            created = [float(entry.get(CREATED, 0)) for entry in stored]
        except (OSError, ValueError, KeyError, TypeError, JoseError) as exc:
            raise ConfigurationError(f"{path}: not a signing key file ({type(exc).__name__}: {exc})") from exc
        if not keys or any(not k.is_private or k.kid is None for k in keys):
            raise ConfigurationError(f"{path}: every key must be a private EC key with a kid")
        return cls(keys, created)

    @property
    def kid(self) -> str:
        """The key id tokens are signed under now."""
        kid = self._keys[0].kid
        assert kid is not None
        return kid

    @property
    def signing_key(self) -> ECKey:
        """The private key that signs now (under `kid`)."""
        return self._keys[0]

    @property
    def public_keys(self) -> KeySet:
        return KeySet([ECKey.import_key(k.as_dict(private=False)) for k in self._keys])

    def jwks(self) -> dict[str, Any]:
        """The published key set (RFC 7517): every key, public parts only."""
        return {"keys": [k.as_dict(private=False) | {"alg": ALGORITHM, "use": "sig"} for k in self._keys]}

    def sign(self, claims: dict[str, Any], *, typ: str = "at+jwt") -> str:
        return jwt.encode({"alg": ALGORITHM, "kid": self.kid, "typ": typ}, claims, self._keys[0])


def rotate(path: str | Path, *, keep_s: float, now: float | None = None) -> SigningKeys:
    """Put a new signing key first; keep older keys that may still verify tokens (superseded less than
    `keep_s` ago: the longest lifetime of what they signed), drop the rest. Returns the new set.

    Raises:
        ConfigurationError: the file is not a key set.
    """
    path = Path(path)
    moment = time.time() if now is None else now
    SigningKeys._read(path)  # refuse to rotate a file that is not a key set
    stored = json.loads(path.read_text())["keys"]
    kept = [stored[0]]
    # A key is superseded when the key before it was made; it verifies tokens until keep_s after that.
    for newer, older in zip(stored, stored[1:], strict=False):
        if moment - float(newer.get(CREATED, 0)) < keep_s:
            kept.append(older)
    _replace(path, json.dumps({"keys": [_new_key(moment), *kept]}))
    return SigningKeys._read(path)


def _replace(path: Path, content: str) -> None:
    """Write `content` to `path` (mode 0600) whole: readers see the old file or the new one."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)


def _new_key(created: float) -> dict[str, Any]:
    key = ECKey.generate_key("P-256", auto_kid=True)
    return key.as_dict(private=True) | {CREATED: int(created)}
