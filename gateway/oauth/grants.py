"""The grants Writ's authorization server runs, on authlib's: authorization code with PKCE (S256 only)
bound to one resource (RFC 8707), and refresh tokens rotated on every use.

authlib validates in one step and issues in the next, so a code or refresh token is claimed in the
store (`redeem_code`, `use_refresh_token`: one conditional UPDATE) only once every check has passed,
right before tokens are minted: a request that fails a check (wrong verifier, wrong redirect) uses
nothing up, and of two requests racing with one secret only one gets tokens.

A refresh speaks for the user as the login knows them now (`KnownUsers`: the built-in login's
configuration; an upstream provider cannot be asked), and only within `sign_in_max_age_s` of the login.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from authlib.oauth2.rfc6749 import InvalidGrantError, InvalidRequestError, OAuth2Error, grants
from authlib.oauth2.rfc7636 import CodeChallenge

from gateway.oauth.models import Client, Code, Token
from store.oauth import CodeGrant, Grantee, GrantRefused, RefreshGrant

if TYPE_CHECKING:
    from gateway.oauth.server import WritAuthorizationServer

logger = logging.getLogger(__name__)

AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]


class InvalidTargetError(OAuth2Error):  # type: ignore[misc]
    """RFC 8707 §2: the `resource` asked for is not this server's."""

    error = "invalid_target"


class S256Only(CodeChallenge):  # type: ignore[misc]
    """PKCE required, with S256: authlib's own would let a request without a challenge through and
    would take `plain` (and a missing method as `plain`)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: send code_challenge (method S256)")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256")
        super().validate_code_challenge(grant, redirect_uri)

    def validate_code_verifier(self, grant: Any, result: Any) -> None:
        # A code presented without its verifier, or with another, is what a stolen code looks like.
        try:
            super().validate_code_verifier(grant, result)
        except OAuth2Error:
            code = grant.request.authorization_code
            grant.server.note_refusal(
                "pkce_mismatch", grant.request.client.client_id, tenant=code.grant.grantee.tenant
            )
            raise


class OneResource:
    """RFC 8707: `resource` is this gateway's MCP endpoint or absent, at /authorize and at /token."""

    def __init__(self, resource: str) -> None:
        self.resource = resource

    def __call__(self, grant: Any) -> None:
        grant.register_hook("after_validate_authorization_request_payload", self.at_authorization)

    def requested(self, grant: Any) -> str | None:
        values = grant.request.payload.datalist.get("resource", [])
        if len(values) > 1:
            raise InvalidTargetError("one resource at a time: this server's MCP endpoint")
        if values and values[0] != self.resource:
            raise InvalidTargetError(f"this server issues tokens for {self.resource} only")
        return values[0] if values else None

    def at_authorization(self, grant: Any, redirect_uri: str) -> None:
        self.requested(grant)

    def at_token(self, grant: Any, bound: Code | Token) -> None:
        asked = self.requested(grant)
        if asked is not None and asked != bound.resource:
            raise InvalidTargetError("the grant is for another resource")


class _Issuing:
    """What both grants share: tokens minted by the server, refresh tokens saved with the family."""

    request: Any
    server: WritAuthorizationServer
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    def validate_token_request(self) -> None:
        super().validate_token_request()  # type: ignore[misc]
        bound = self.request.authorization_code or self.request.refresh_token
        self.server.resource.at_token(self, bound)

    def generate_token(
        self,
        user: Grantee | None = None,
        scope: str | None = None,
        grant_type: str | None = None,
        expires_in: int | None = None,
        include_refresh_token: bool = True,
    ) -> dict[str, Any]:
        assert user is not None
        return self.server.mint(self.request, user, scope or "", include_refresh_token=include_refresh_token)


class AuthorizationCode(_Issuing, grants.AuthorizationCodeGrant):  # type: ignore[misc]
    def save_authorization_code(self, code: str, request: Any) -> None:
        self.server.save_code(code, request)

    def validate_authorization_redirect_uri(self, request: Any, client: Client) -> str:
        try:
            return str(grants.AuthorizationCodeGrant.validate_authorization_redirect_uri(request, client))
        except OAuth2Error:
            asked = request.payload.redirect_uri
            if asked:  # one the client did not register (a missing one is a plain bad request)
                self.server.note_refusal("redirect_mismatch", client.client_id, redirect_uri=asked)
            raise

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        found = self.server.store.find_code(code)
        if found is None or found.client_id != client.client_id:
            return None
        if found.used_at is not None:
            self.redeem(code, client, tenant=found.grantee.tenant)  # a replay: it revokes what it made
        asked = self.request.payload.redirect_uri
        if found.redirect_uri and asked != found.redirect_uri:
            # authlib refuses it next (invalid_grant); the redirect the code was sent to is not this one.
            self.server.note_refusal(
                "redirect_mismatch", client.client_id, tenant=found.grantee.tenant, redirect_uri=asked
            )
        return Code(code, found)

    def authenticate_user(self, authorization_code: Code) -> Grantee:
        grant = self.redeem(
            authorization_code.code, self.request.client, tenant=authorization_code.grant.grantee.tenant
        )
        self.request.family_id = grant.family_id
        self.request.resource = grant.resource
        self.request.auth_time = grant.auth_time
        return grant.grantee

    def redeem(self, code: str, client: Client, *, tenant: str) -> CodeGrant:
        try:
            return self.server.store.redeem_code(code, client_id=client.client_id, now=self.server.now())
        except GrantRefused as exc:
            self.server.refused(exc, "authorization code", client.client_id, tenant=tenant)
            raise InvalidGrantError(str(exc)) from exc

    def delete_authorization_code(self, authorization_code: Code) -> None:
        """Nothing to delete: `authenticate_user` marked it used, and a used code is kept to
        recognise a replay until it has long expired."""


class RefreshToken(_Issuing, grants.RefreshTokenGrant):  # type: ignore[misc]
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        found = self.server.store.find_refresh_token(refresh_token)
        if found is None:
            return None
        if found.used_at is not None:
            # reuse: using it again revokes its family
            self.use(refresh_token, found.client_id, tenant=found.grantee.tenant)
        self.request.grantee_tenant = found.grantee.tenant
        return Token.of_refresh(refresh_token, found)

    def authenticate_user(self, refresh_token: Token) -> Grantee:
        """Who the new tokens speak for: the user as the login knows them now, not as they signed in.

        Raises:
            InvalidGrantError: the token is refused (see `use`), or the login no longer knows the user
                (their sign-in is ended: they sign in again, if they still may).
        """
        client_id = self.request.client.client_id
        grant = self.use(refresh_token.value, client_id, tenant=self.request.grantee_tenant)
        user = self.server.users.current(grant.grantee)
        if user is None:
            signed_in = grant.grantee
            self.server.store.revoke_family(
                grant.family_id, reason="login_user_removed", now=self.server.now()
            )
            logger.warning(
                "refused refresh token of client %s: %s is no longer a user of the login in tenant %s",
                client_id,
                signed_in.subject,
                signed_in.tenant,
            )
            raise InvalidGrantError(f"{signed_in.subject} can no longer sign in here; the sign-in is ended")
        self.request.family_id = grant.family_id
        self.request.resource = grant.resource
        self.request.auth_time = grant.auth_time
        return user

    def use(self, token: str, client_id: str, *, tenant: str | None) -> RefreshGrant:
        now = self.server.now()
        oldest = now - timedelta(seconds=self.server.settings.sign_in_max_age_s)
        try:
            return self.server.store.use_refresh_token(
                token, client_id=client_id, now=now, signed_in_after=oldest
            )
        except GrantRefused as exc:
            self.server.refused(exc, "refresh token", client_id, tenant=tenant)
            raise InvalidGrantError(str(exc)) from exc

    def revoke_old_credential(self, refresh_token: Token) -> None:
        """Nothing left to do: `authenticate_user` used it up."""
