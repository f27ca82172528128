"""The `backends:` and `capabilities:` sections of Writ's YAML config, as pydantic models.

The gateway's config model holds them, so the whole file is validated at load. Parsing checks shape
and cross references (a capability names an existing backend of a fitting type); it resolves no
credentials and imports no code. That happens when the registry is built.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from capabilities.contract import ConfigError, EffectClass, config_problems
from capabilities.pointers import parse_pointer


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _without_undeclared(dumped: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """`dumped` without the settings among `names` left undeclared (None).

    What a capability is dumped as is part of its contract hash, which derived keys and approvals
    bind. A setting added after contracts were recorded, when left out, must dump as it did before it
    existed: then an upgrade changes no key, and a call of unknown outcome is still joined by its re-send.
    """
    return {name: value for name, value in dumped.items() if name not in names or value is not None}


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (RFC 9110 token)."""


def _header_name(name: str) -> str:
    # httpx2 refuses it only when a request is sent: every call would fail as request_error.
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
    return name


def _header_fields(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        _header_name(name)
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"the value of {name!r} holds a line break or NUL")
    return headers


# --- backend credentials -------------------------------------------------------------------------


class _SecretSource(_Model):
    token_env: str | None = None
    token_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> _SecretSource:
        if (self.token_env is None) == (self.token_file is None):
            raise ValueError("set exactly one of token_env, token_file")
        return self


class BearerAuth(_SecretSource):
    """`Authorization: Bearer <token>`."""

    type: Literal["bearer"]


class HeaderAuth(_SecretSource):
    """`<header>: <token>`, e.g. an API key header."""

    type: Literal["header"]
    header: str = Field(min_length=1)

    _check_header = field_validator("header")(_header_name)


class BasicAuth(_Model):
    """HTTP basic auth; the username may be literal, the password comes from env or a file."""

    type: Literal["basic"]
    username: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    password_file: str | None = None

    @model_validator(mode="after")
    def _sources(self) -> BasicAuth:
        if (self.username is None) == (self.username_env is None):
            raise ValueError("set exactly one of username, username_env")
        if (self.password_env is None) == (self.password_file is None):
            raise ValueError("set exactly one of password_env, password_file")
        return self


class OAuth2ClientCredentialsAuth(_Model):
    """A bearer token Writ gets for itself from `token_url` (OAuth 2.0 client credentials grant)."""

    type: Literal["oauth2_client_credentials"]
    token_url: str
    client_id: str = Field(min_length=1)
    client_secret_env: str | None = None
    client_secret_file: str | None = None
    scope: str | list[str] | None = None
    audience: str | None = None
    """Sent as `audience` (the parameter Auth0 and Okta use to pick the API)."""
    resource: str | None = None
    """Sent as `resource` (RFC 8707 resource indicator)."""
    auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    timeout_s: float = Field(default=10.0, gt=0)
    refresh_margin_s: float = Field(default=60.0, ge=0)
    """Fetch a new token this long before the cached one expires (at most half its lifetime)."""

    @model_validator(mode="after")
    def _one_secret(self) -> OAuth2ClientCredentialsAuth:
        _no_userinfo(self.token_url)
        if (self.client_secret_env is None) == (self.client_secret_file is None):
            raise ValueError("set exactly one of client_secret_env, client_secret_file")
        return self


AuthConfig = Annotated[
    BearerAuth | HeaderAuth | BasicAuth | OAuth2ClientCredentialsAuth, Field(discriminator="type")
]


# --- backends --------------------------------------------------------------------------------------


def _no_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http(s) URL")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials; use auth:")
    return url


class HttpBackend(_Model):
    type: Literal["http"]
    base_url: str
    timeout_s: float = Field(default=30.0, gt=0)
    commit_horizon_s: float | None = Field(default=None, gt=0)
    """How long after dispatch a request may still take effect at the backend (default: timeout + 600 s)."""
    headers: dict[str, str] = Field(default_factory=dict)
    auth: AuthConfig | None = None
    max_connections: int = Field(default=100, ge=1)
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """A response body (decoded) longer than this is not read on: the call gets `response_too_large`."""

    _check_url = field_validator("base_url")(_no_userinfo)
    _check_headers = field_validator("headers")(_header_fields)


# --- reading a lookup's answer ----------------------------------------------------------------------

StateValue = str | bool | int | float
"""A value a record's state field may hold (compared by JSON type: `true` is not `1`)."""


def _pointer(pointer: str) -> str:
    parse_pointer(pointer)
    return pointer


def _optional_pointer(pointer: str | None) -> str | None:
    return None if pointer is None else _pointer(pointer)


class RecordOutcome(_Model):
    """How to read a found record's state (`outcome:` of a lookup): the field holding it, and which
    values mean the effect succeeded or failed. Any other value (`processing`) tells nothing yet."""

    field: str
    """A JSON pointer (RFC 6901) into the record, e.g. `/status`."""
    succeeded: list[StateValue] = Field(min_length=1)
    failed: list[StateValue] = Field(default_factory=list)
    """Only final states: a record in one of them settles the call `failed` at once."""

    @field_validator("succeeded", "failed", mode="before")
    @classmethod
    def _scalars(cls, values: Any, info: ValidationInfo) -> Any:
        if not isinstance(values, list):
            return values
        if info.field_name == "succeeded" and not values:
            raise ValueError("list at least one value that means the effect succeeded")
        for value in values:
            if not isinstance(value, str | bool | int | float):
                raise ValueError(f"{value!r} is not a string, number or boolean a state field could hold")
        return values

    @field_validator("field")
    @classmethod
    def _field_pointer(cls, pointer: str) -> str:
        if pointer == "":
            raise ValueError("'' names the whole record; name the member holding its state, e.g. /status")
        return _pointer(pointer)

    @model_validator(mode="after")
    def _apart(self) -> RecordOutcome:
        both = [value for value in self.succeeded if any(same_state(value, f) for f in self.failed)]
        if both:
            shown = ", ".join(repr(value) for value in both)
            raise ValueError(f"{shown} listed as both succeeded and failed")
        return self


def same_state(found: Any, listed: StateValue) -> bool:
    """Whether the JSON value `found` is the declared `listed` (of the same JSON type: `true` is not `1`)."""
    return isinstance(found, bool) == isinstance(listed, bool) and found == listed


class LookupReading(_Model):
    """How to read a lookup's answer; without either, the default reading (README, "Reading a
    lookup's answer")."""

    records: str | None = None
    """A JSON pointer to the record(s) in the answer (`/refunds`; `""` for the whole answer)."""
    outcome: RecordOutcome | None = None

    _check_records = field_validator("records")(_optional_pointer)

    @model_serializer(mode="wrap")
    def _declared_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_undeclared(handler(self), ("records", "outcome"))


class McpReconcile(LookupReading):
    """How to learn the outcome of an earlier call: another upstream tool, looked up by key.

    String values of `arguments` are templates over the call's arguments and `idempotency_key`,
    `external_request_id`, `tool_call_id`; a value that is exactly one field keeps its type.
    """

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments")
    @classmethod
    def _templates(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        for value in arguments.values():
            if isinstance(value, str):
                template_fields(value)
        return arguments


ToolErrors = Literal["may_follow_effect", "before_effect"]
"""When an upstream MCP tool reports an error (`isError: true`): at any time, after its effect too
(`may_follow_effect`), or only before it has any effect (`before_effect`)."""


class McpToolSettings(_Model):
    """Per-tool settings of an MCP backend (`defaults:` for all tools, `overrides:` per upstream name)."""

    effect: EffectClass | None = None
    version: str | None = None
    description: str | None = None
    title: str | None = None
    dedupes_on_key: bool | None = None
    dedupe_window_s: int | None = Field(default=None, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    commit_horizon_s: float | None = Field(default=None, gt=0)
    redact: tuple[str, ...] | None = None
    summary: str | None = None
    reconcile: McpReconcile | None = None
    """An upstream tool that looks up the outcome of an earlier call (makes the tool reconcilable)."""
    tool_errors: ToolErrors | None = None
    """When the tool reports an error. `may_follow_effect` (the default): an error may come after the
    tool acted (the MCP SDK's servers turn any exception a tool raises into one), so for a tool with an
    effect it is `result_unknown`, settled by reconciliation. `before_effect`: the operator declares
    that this upstream reports tool errors only before any effect, so one is `failed`. A read's is
    `failed` either way."""

    @model_serializer(mode="wrap")
    def _declared_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_undeclared(handler(self), ("tool_errors",))


_PROMPT_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A prompt name Writ shows: as a tool name should be (MCP 2025-11-25, SEP-986)."""


def _relay_switch(value: Any) -> Any:
    """`resources: true` is `resources: {}`; `false` turns the relay off, as leaving it out does."""
    if value is True:
        return {}
    return None if value is False else value


class McpResources(_Model):
    """The upstream's resources and resource templates, relayed (`resources:` of an MCP backend)."""

    uri_prefix: str = ""
    """Put before every URI and URI template the upstream lists (`notes+` shows `file:///a` as
    `notes+file:///a`); a read's URI loses it again on its way upstream. Keeps several upstreams'
    resources apart: each backend that relays resources needs its own when more than one does."""

    @field_validator("uri_prefix")
    @classmethod
    def _printable(cls, value: str) -> str:
        if value != value.strip() or not value.isprintable() or " " in value:
            raise ValueError("must be printable text without spaces")
        return value


class McpPrompts(_Model):
    """The upstream's prompts, relayed (`prompts:` of an MCP backend), named as its tools are."""

    names: Literal["*"] | list[str] = "*"
    """Upstream prompt names to relay, or `*` for every one."""
    prefix: str = ""
    """Put before every relayed prompt's name (`notes_` shows `summarize` as `notes_summarize`)."""
    rename: dict[str, str] = Field(default_factory=dict)
    """Upstream name -> the name Writ shows (instead of the prefixed one)."""
    redact: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Upstream name -> prompt arguments stored only as salted hashes."""

    @field_validator("prefix")
    @classmethod
    def _prefix_chars(cls, value: str) -> str:
        if value and not _PROMPT_NAME.fullmatch(value):
            raise ValueError("must be letters, digits, '_', '-', '.' (it starts every prompt name shown)")
        return value

    @field_validator("rename")
    @classmethod
    def _renamed_chars(cls, value: dict[str, str]) -> dict[str, str]:
        for upstream, shown in value.items():
            if not _PROMPT_NAME.fullmatch(shown):
                raise ValueError(f"{upstream} -> {shown!r}: a name is 1 to 128 of A-Z a-z 0-9 _ - .")
        return value

    def shown(self, upstream: str) -> str:
        """The name Writ shows for the upstream prompt `upstream`."""
        return self.rename.get(upstream, self.prefix + upstream)


class McpBackend(_Model):
    type: Literal["mcp"]
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    auth: AuthConfig | None = None
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    env_from: dict[str, str] = Field(default_factory=dict)
    """Child variable -> host variable, for secrets a stdio upstream needs."""
    cwd: str | None = None
    mode: str = "auto"
    """How the MCP client negotiates: `auto`, `legacy`, or a modern protocol version."""
    timeout_s: float = Field(default=30.0, gt=0)
    commit_horizon_s: float | None = Field(default=None, gt=0)
    """How long after dispatch a request may still take effect at the backend (default: timeout + 600 s)."""
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """The longest answer read: for a `url:` upstream a JSON body (decoded) or one SSE event, for a
    `command:` one a line of stdout (one message); a longer one is not held and the call gets
    `response_too_large`. A line going on past 16 times this also restarts a `command:` upstream."""
    tools: Literal["*"] | list[str] = "*"
    rename: dict[str, str] = Field(default_factory=dict)
    defaults: McpToolSettings = Field(default_factory=McpToolSettings)
    overrides: dict[str, McpToolSettings] = Field(default_factory=dict)
    resources: McpResources | None = None
    """Relay the upstream's resources (reads decided by policy); off unless set (`true` or a mapping)."""
    prompts: McpPrompts | None = None
    """Relay the upstream's prompts (gets decided by policy); off unless set (`true` or a mapping)."""

    _check_headers = field_validator("headers")(_header_fields)

    @field_validator("resources", "prompts", mode="before", json_schema_input_type=bool | dict[str, Any])
    @classmethod
    def _switch(cls, value: Any) -> Any:
        return _relay_switch(value)

    @model_validator(mode="after")
    def _one_transport(self) -> McpBackend:
        if (self.url is None) == (self.command is None):
            raise ValueError("set exactly one of url (streamable HTTP), command (stdio)")
        if self.url is not None:
            _no_userinfo(self.url)
            if self.env or self.env_from or self.cwd:
                raise ValueError("env, env_from and cwd apply to stdio (command) upstreams only")
        elif self.auth is not None or self.headers:
            raise ValueError("auth and headers apply to HTTP (url) upstreams; pass secrets via env_from")
        return self


class PythonBackend(_Model):
    type: Literal["python"]
    max_threads: int = Field(default=8, ge=1)
    """Threads the backend's sync callables run on; callables that hang hold them (they cannot be
    stopped), so this bounds what they can hold. A call finding all busy waits within its timeout."""
    commit_horizon_s: float | None = Field(default=None, gt=0)
    """How long after dispatch a request may still take effect at the backend (default: timeout + 600 s)."""


def check_horizon(owner: str, timeout_s: float, commit_horizon_s: float | None) -> None:
    """Refuse a horizon inside the timeout: a lookup then could call a request failed while Writ itself
    was still waiting for its answer.

    Raises:
        ConfigError: naming the owner, both values and the fix.
    """
    if commit_horizon_s is not None and commit_horizon_s < timeout_s:
        raise ConfigError(
            f"{owner}: commit_horizon_s {commit_horizon_s:g} is shorter than timeout_s {timeout_s:g}; "
            "a request can take effect at least until Writ stops waiting for it (set it >= timeout_s)"
        )


BackendConfig = Annotated[HttpBackend | McpBackend | PythonBackend, Field(discriminator="type")]


# --- capabilities ----------------------------------------------------------------------------------


def template_fields(template: str) -> list[str]:
    """The `{name}` fields of a path template.

    Raises:
        ValueError: a field is not a plain name (no attribute access, index or format spec).
    """
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"template field {{{name}}} must be a plain argument name")
        names.append(name)
    return names


_METHOD = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
_METHOD_LOWER = Literal["get", "post", "put", "patch", "delete"]


class RequestSpec(_Model):
    method: _METHOD = "POST"
    path: str

    # The schema says what the file may hold (editors complete from it), the model what it holds.
    @field_validator("method", mode="before", json_schema_input_type=_METHOD | _METHOD_LOWER)
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("path")
    @classmethod
    def _template(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError("must start with /")
        template_fields(path)
        return path


class HttpLookup(RequestSpec, LookupReading):
    """An HTTP capability's `reconcile:`: the request that looks an earlier dispatch up, and how to
    read its answer."""


class CapabilityConfig(_Model):
    id: str = Field(min_length=1)
    version: str = "1"
    tool: str | None = None
    """The MCP tool name; defaults to the id."""
    backend: str
    effect: EffectClass = "write"
    description: str = ""
    title: str | None = None
    input_schema: dict[str, Any] | None = None
    request: RequestSpec | None = None
    idempotency_header: str = "Idempotency-Key"
    commit_deadline_header: str | None = None
    """Send the commit deadline (RFC 3339 UTC) in this header, for a backend that refuses to commit a
    request past it."""
    dedupes_on_key: bool = False
    dedupe_window_s: int = Field(default=600, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    commit_horizon_s: float | None = Field(default=None, gt=0)
    redact: tuple[str, ...] = ()
    summary: str | None = None
    reconcile: HttpLookup | None = None
    callable: str | None = None

    _check_idempotency_header = field_validator("idempotency_header")(_header_name)

    @field_validator("commit_deadline_header")
    @classmethod
    def _deadline_header(cls, value: str | None) -> str | None:
        return _header_name(value) if value is not None else None

    @field_validator("version", mode="before", json_schema_input_type=str | int | float)
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @field_validator("callable")
    @classmethod
    def _callable_ref(cls, value: str | None) -> str | None:
        if value is not None and value.count(":") != 1:
            raise ValueError("must look like 'package.module:function'")
        return value

    @property
    def tool_name(self) -> str:
        return self.tool or self.id


def check_uri_prefixes(backends: Mapping[str, BackendConfig]) -> None:
    """Every relayed resource URI belongs to one backend: with several relaying, each has a prefix and
    none begins another's.

    Raises:
        ValueError: naming the backends and what to fix.
    """
    relaying = {
        name: backend.resources.uri_prefix
        for name, backend in backends.items()
        if isinstance(backend, McpBackend) and backend.resources is not None
    }
    if len(relaying) < 2:
        return
    bare = sorted(name for name, prefix in relaying.items() if not prefix)
    if bare:
        raise ValueError(
            f"backends {', '.join(map(repr, sorted(relaying)))} relay resources: each needs its own "
            f"resources.uri_prefix to keep their URIs apart (missing for {', '.join(map(repr, bare))})"
        )
    for name, prefix in relaying.items():
        for other, other_prefix in relaying.items():
            if name != other and other_prefix.startswith(prefix):
                raise ValueError(
                    f"backend {other!r}: resources.uri_prefix {other_prefix!r} begins with backend "
                    f"{name!r}'s {prefix!r}, so a URI could belong to both; make neither begin the other"
                )


def check_references(backends: Mapping[str, BackendConfig], capabilities: Sequence[CapabilityConfig]) -> None:
    """Each capability names a backend that exists and suits it, and ids are unique.

    Raises:
        ValueError: naming the capability and what to fix.
    """
    seen: set[str] = set()
    for cap in capabilities:
        where = f"capability {cap.id!r}"
        if cap.id in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(cap.id)
        backend = backends.get(cap.backend)
        if backend is None:
            raise ValueError(f"{where}: unknown backend {cap.backend!r}")
        if isinstance(backend, McpBackend):
            raise ValueError(
                f"{where}: backend {cap.backend!r} is an MCP upstream; its tools are discovered "
                "(configure them with tools/rename/defaults/overrides)"
            )
        if isinstance(backend, HttpBackend):
            if cap.request is None:
                raise ValueError(f"{where}: an http backend needs request: {{method, path}}")
            if cap.input_schema is None:
                raise ValueError(f"{where}: an http backend needs input_schema")
            if cap.callable is not None:
                raise ValueError(f"{where}: callable applies to python backends only")
        if isinstance(backend, PythonBackend):
            if cap.callable is None:
                raise ValueError(f"{where}: a python backend needs callable: 'module:function'")
            if cap.request is not None or cap.reconcile is not None:
                raise ValueError(f"{where}: request and reconcile apply to http backends only")


class CapabilitiesConfig(_Model):
    """Both sections together, cross-checked: what the registry is built from."""

    backends: dict[str, BackendConfig] = Field(default_factory=dict)
    capabilities: list[CapabilityConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cross_check(self) -> CapabilitiesConfig:
        check_references(self.backends, self.capabilities)
        check_uri_prefixes(self.backends)
        return self


def parse_config(backends: Mapping[str, Any] | None, capabilities: list[Any] | None) -> CapabilitiesConfig:
    """Validate the two sections given apart from a config file (the file is validated whole by the
    gateway's config model, which holds the same models).

    Raises:
        ConfigError: with one line per problem, each naming the backend or capability.
    """
    data = {"backends": dict(backends or {}), "capabilities": list(capabilities or [])}
    try:
        return CapabilitiesConfig.model_validate(data)
    except ValidationError as exc:
        lines = config_problems(exc.errors(), data)
        raise ConfigError("invalid backends/capabilities config:\n  " + "\n  ".join(lines)) from None
