"""The built-in development issuer: real ES256 JWTs from a key kept under ./.writ/.

It lets the embedded default run with real tokens and no external identity provider. Production
deployments configure their own issuers; the verifier treats this one like any other.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet

from gateway.secret_files import create_once

ALGORITHM = "ES256"


class DevIssuer:
    """Holds the signing key; mints tokens for `writ token` and `writ demo`."""

    def __init__(self, key: ECKey, issuer: str) -> None:
        self._key = key
        self.issuer = issuer

    @classmethod
    def load_or_create(cls, key_file: str | Path, issuer: str) -> DevIssuer:
        """Load the private key, creating it (mode 0600) on first use."""
        path = Path(key_file)
        if not path.exists():
            created = ECKey.generate_key("P-256", auto_kid=True)
            # Or another process's wins.
            create_once(path, json.dumps(created.as_dict(private=True)), what="dev issuer signing key")
        return cls(ECKey.import_key(json.loads(path.read_text())), issuer)

    @property
    def public_keys(self) -> KeySet:
        return KeySet([ECKey.import_key(self._key.as_dict(private=False))])

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self._key.as_dict(private=False) | {"alg": ALGORITHM, "use": "sig"}]}

    def mint(
        self,
        *,
        subject: str,
        audience: str,
        tenant: str = "default",
        roles: Iterable[str] = (),
        scopes: Iterable[str] = (),
        ttl_s: int = 3600,
        client_id: str = "writ-dev",
        now: float | None = None,
    ) -> str:
        """A signed access token for `subject`, valid for `audience` (the resource URL)."""
        issued = int(now if now is not None else time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "iat": issued,
            "nbf": issued,
            "exp": issued + ttl_s,
            "jti": uuid.uuid4().hex,
            "tenant": tenant,
            "roles": sorted(set(roles)),
            "client_id": client_id,
        }
        if scope := " ".join(sorted(set(scopes))):
            claims["scope"] = scope
        return jwt.encode({"alg": ALGORITHM, "kid": self._key.kid, "typ": "at+jwt"}, claims, self._key)
