"""Requests as authlib's server reads them, built from a request read whole, and its answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from authlib.oauth2.rfc6749 import OAuth2Payload, OAuth2Request
from authlib.oauth2.rfc6749.requests import JsonPayload, JsonRequest


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer of the server: status, body (a JSON object or text) and headers."""

    status: int
    body: Mapping[str, Any] | str
    headers: Sequence[tuple[str, str]]

    @property
    def location(self) -> str | None:
        return next((v for k, v in self.headers if k.lower() == "location"), None)


class _Payload(OAuth2Payload):  # type: ignore[misc]
    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._data: dict[str, str] = {}
        self._datalist: dict[str, list[str]] = {}
        for key, value in pairs:
            self._data.setdefault(key, value)
            self._datalist.setdefault(key, []).append(value)

    @property
    def data(self) -> dict[str, str]:
        return self._data

    @property
    def datalist(self) -> dict[str, list[str]]:
        return self._datalist


class HttpRequest(OAuth2Request):  # type: ignore[misc]
    """A request read whole: its query and form parameters, and its headers."""

    def __init__(
        self,
        method: str,
        uri: str,
        headers: Mapping[str, str],
        query: Sequence[tuple[str, str]] = (),
        form: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(method, uri, headers=headers)
        self._args = dict(reversed(query))  # the first value wins, as in the payload
        self._form = dict(reversed(form))
        self.payload = _Payload([*query, *form])
        self.family_id: str | None = None
        self.resource: str | None = None
        self.auth_time: datetime | None = None
        self.grantee_tenant: str | None = None
        """The tenant of the grant a refresh token belongs to, once it is found (for security events)."""
        """When the user signed in to the grant redeemed (for its ID token and refresh tokens)."""

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _JsonPayload(JsonPayload):  # type: ignore[misc]
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @property
    def data(self) -> dict[str, Any]:
        return self._data


class HttpJsonRequest(JsonRequest):  # type: ignore[misc]
    def __init__(self, method: str, uri: str, headers: Mapping[str, str], body: dict[str, Any]) -> None:
        super().__init__(method, uri, headers)
        self.payload = _JsonPayload(body)
