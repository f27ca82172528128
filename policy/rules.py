"""The `policy:` section of Writ's config, as pydantic models.

Shape only: expressions are compiled by `policy.cel` when a `Policy` is built. Every rule-level error
names the rule id, so a typo in a long policy file points at the rule that has it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from capabilities.contract import EffectClass, config_problems

from .model import Effect

RESERVED_REASONS = frozenset({"no_matching_rule", "policy_error"})
"""Reason codes the engine produces by itself; a rule using them would make the audit ambiguous."""

_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_INPUT = Annotated[int, Field(gt=0)] | Annotated[str, Field(pattern=_DURATION.pattern)]
"""What the file may hold for a duration, as the published schema says it."""


def parse_duration(value: object) -> int:
    """Seconds from an int or a string like "90s", "30m", "1h", "2d"; must be positive.

    Raises:
        ValueError: the value is not a positive duration.
    """
    if isinstance(value, bool):
        raise ValueError("expected seconds (int) or a duration like '90s', '30m', '1h', '2d'")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration; use seconds or '90s', '30m', '1h', '2d'")
    if seconds <= 0:
        raise ValueError("must be positive")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_M = TypeVar("_M", bound=BaseModel)


def _named(kind: str, data: Any, handler: ModelWrapValidatorHandler[_M]) -> _M:
    """Validate one entry of a list (a rule, a budget); a failure names the entry by its id."""
    try:
        return handler(data)
    except ValidationError as exc:
        entry_id = data.get("id") if isinstance(data, Mapping) else None
        label = f"{kind} {entry_id!r}" if isinstance(entry_id, str) else f"{kind} without a valid id"
        problems = "; ".join(config_problems(exc.errors(), data))
        raise ValueError(f"{label}: {problems}") from None


def _code(value: str) -> str:
    """An id as the audit names it: letters, digits and a few separators."""
    if not _CODE.match(value):
        raise ValueError("must be letters, digits, '_', '-', '.', ':' (starting with a letter or digit)")
    return value


class ApprovalConfig(_Strict):
    """Who must approve a `require_approval` decision, and for how long the request stands."""

    approver_role: str = Field(min_length=1)
    expires_in: int = 3600
    """Seconds; the config also accepts "90s", "30m", "1h", "2d"."""
    requester_may_approve: bool = False

    @field_validator("expires_in", mode="before", json_schema_input_type=_DURATION_INPUT)
    @classmethod
    def _duration(cls, value: object) -> int:
        return parse_duration(value)


class Rule(_Strict):
    """One policy rule: a scope (who, which tools), an optional condition, and a decision."""

    id: str
    tools: list[str] = Field(default_factory=lambda: ["*"])
    """MCP tool names, capability ids or `id@version` refs; fnmatch globs (`*`, `refund_*`) allowed."""
    resources: list[str] | None = None
    """Instead of tools: relayed resources whose URI (as Writ shows it) matches one of these globs."""
    prompts: list[str] | None = None
    """Instead of tools: relayed prompts by name (as Writ shows it) or capability id; globs allowed."""
    roles: list[str] | None = None
    """The principal must hold at least one of these roles. Omitted: any principal."""
    subjects: list[str] | None = None
    tenants: list[str] | None = None
    effects: list[EffectClass] | None = None
    """Capability effect classes this rule covers. Omitted: all."""
    when: str | None = None
    """A CEL expression over `args`, `principal`, `capability`, `context`; must yield a bool."""
    decision: Effect
    reason: str | None = None
    """A stable reason code; defaults to the rule id."""
    message: str | None = None
    approval: ApprovalConfig | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_rule(cls, data: Any, handler: ModelWrapValidatorHandler[Rule]) -> Rule:
        # Pydantic reports `rules.3.approval.approver_role`; people think in rule ids, so say both.
        return _named("rule", data, handler)

    @field_validator("id")
    @classmethod
    def _id_is_a_code(cls, value: str) -> str:
        return _code(value)

    @field_validator("reason")
    @classmethod
    def _reason_is_a_code(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _CODE.match(value):
            raise ValueError("must be a code of letters, digits, '_', '-', '.', ':'")
        if value in RESERVED_REASONS:
            raise ValueError(f"{value!r} is reserved for decisions the engine makes itself")
        return value

    @field_validator("tools", "roles", "subjects", "tenants", "effects", "resources", "prompts")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or any(not item for item in value)):
            raise ValueError("must list at least one non-empty name (omit the field to match any)")
        return value

    @field_validator("when")
    @classmethod
    def _when_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a CEL expression (omit the field for an unconditional rule)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Rule:
        # Runs outside `_name_the_rule`, so it names the rule itself.
        named = [f for f in ("tools", "resources", "prompts") if f in self.model_fields_set]
        if len(named) > 1:
            raise ValueError(
                f"rule {self.id!r}: {' and '.join(named)}: a rule covers tool calls (tools), resource "
                "reads (resources) or prompt gets (prompts); write one rule for each"
            )
        return self

    @model_validator(mode="after")
    def _approval_matches_decision(self) -> Rule:
        # Runs outside `_name_the_rule`, so it names the rule itself.
        if self.decision == "require_approval" and self.approval is None:
            raise ValueError(
                f"rule {self.id!r}: approval: decision require_approval needs approval.approver_role"
            )
        if self.decision != "require_approval" and self.approval is not None:
            raise ValueError(
                f"rule {self.id!r}: approval: only applies to decision require_approval, not {self.decision}"
            )
        return self

    @property
    def reason_code(self) -> str:
        return self.reason or self.id

    @property
    def kind(self) -> str:
        """What the rule covers: `tool`, `resource` or `prompt` calls."""
        return "resource" if self.resources is not None else "prompt" if self.prompts is not None else "tool"


class Conversion(_Strict):
    """Spend in several currencies counted as one: each amount times its currency's rate to `to`."""

    to: str = Field(min_length=1)
    rates: dict[str, Decimal] = Field(default_factory=dict)
    """Units of `to` per unit of each other currency; a currency not listed denies the call."""

    @field_validator("rates")
    @classmethod
    def _positive(cls, rates: dict[str, Decimal]) -> dict[str, Decimal]:
        for currency, rate in rates.items():
            if rate <= 0:
                raise ValueError(f"rate of {currency} must be positive")
        return rates


class _CallScope(_Strict):
    """Which tool calls a budget or a loop rule counts: as a rule matches them (`tools`, `roles`,
    `subjects`, `tenants`, `effects`), tool calls only (relayed resource reads and prompt gets are
    not counted)."""

    id: str
    tools: list[str] = Field(default_factory=lambda: ["*"])
    roles: list[str] | None = None
    subjects: list[str] | None = None
    tenants: list[str] | None = None
    effects: list[EffectClass] | None = None

    @field_validator("id")
    @classmethod
    def _id_is_a_code(cls, value: str) -> str:
        return _code(value)

    @field_validator("tools", "roles", "subjects", "tenants", "effects")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or any(not item for item in value)):
            raise ValueError("must list at least one non-empty name (omit the field to match any)")
        return value

    @property
    def resources(self) -> None:
        return None

    @property
    def prompts(self) -> None:
        return None


class Budget(_CallScope):
    """A limit on calls or spend, counted in the store per scope and window (issue 13).

    Scoped to calls as a rule is (`tools`, `roles`, `subjects`, `tenants`, `effects`); counted per
    principal, tenant, run, or principal and capability; over fixed UTC windows or a whole run.
    """

    scope: Literal["principal", "tenant", "run", "capability"] = "principal"
    """Who shares one counter: a principal, a whole tenant, one run, or a principal's calls of one tool."""
    window: int | Literal["run"] = 86400
    """Seconds (or "1m", "1h", "1d", ...), aligned to the epoch in UTC; or `run`: the run's lifetime."""
    measure: Literal["calls", "spend"] = "calls"
    limit: Decimal = Field(gt=0, max_digits=18, decimal_places=6)
    """Calls, or the spend's units; up to six decimal places."""
    amount: str | None = None
    """For `spend`: a CEL expression giving the call's non-negative amount, e.g. `args.amount`."""
    currency: str | None = None
    """For `spend`: a CEL expression giving a string; each currency is counted apart unless converted."""
    convert: Conversion | None = None
    """For `spend` with a `currency`: count every currency as `convert.to` at the rates given."""
    on_exceed: Literal["deny", "require_approval"] = "deny"
    """`deny`: refuse a call past the limit; `require_approval`: send it to a person (`approval`)."""
    approval: ApprovalConfig | None = None
    """With `on_exceed: require_approval`: who decides a call past the limit, and how long it waits."""

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_budget(cls, data: Any, handler: ModelWrapValidatorHandler[Budget]) -> Budget:
        return _named("budget", data, handler)

    @field_validator("window", mode="before", json_schema_input_type=_DURATION_INPUT | Literal["run"])
    @classmethod
    def _window(cls, value: object) -> int | str:
        return "run" if value == "run" else parse_duration(value)

    @model_validator(mode="after")
    def _amount_matches_measure(self) -> Budget:
        if self.measure == "spend" and not (self.amount and self.amount.strip()):
            raise ValueError(f"budget {self.id!r}: amount: measure spend needs a CEL expression")
        if self.measure == "calls" and (self.amount is not None or self.currency is not None):
            raise ValueError(f"budget {self.id!r}: amount and currency only apply to measure spend")
        if self.convert is not None and self.currency is None:
            raise ValueError(f"budget {self.id!r}: convert: needs a currency expression to convert from")
        if self.measure == "calls" and self.limit != self.limit.to_integral_value():
            raise ValueError(f"budget {self.id!r}: limit: a number of calls is a whole number")
        if self.on_exceed == "require_approval" and self.approval is None:
            raise ValueError(f"budget {self.id!r}: on_exceed require_approval needs approval.approver_role")
        if self.on_exceed == "deny" and self.approval is not None:
            raise ValueError(f"budget {self.id!r}: approval: only applies to on_exceed require_approval")
        return self

    @property
    def window_s(self) -> int | None:
        """The window's length in seconds; None for a run's lifetime."""
        return None if self.window == "run" else int(self.window)


class LoopRule(_CallScope):
    """Calls of one principal that repeat the same action, or nearly, or fail the same way, too often
    in a window (issue 13).

    Scoped to calls as a budget is. Two calls are the same when they name the same capability and
    their arguments are equal once the top-level fields in `ignore` are removed (none: the same
    action). Once `threshold` such calls were admitted in a fixed UTC window of `window` seconds (with
    `count: failures`: once `threshold` calls of the capability failed with one error), the next is
    refused `loop_detected`, and so is every later one until the window ends. With `on_detect:
    pause_run` the refusal also stops the call's run, as a person's stop does, until a person resumes it.
    """

    ignore: list[str] = Field(default_factory=list)
    """Top-level argument fields a near-identical call may differ in, e.g. `amount`."""
    count: Literal["calls", "failures"] = "calls"
    """`failures`: count the calls of a capability that failed, per error, whatever their arguments."""
    threshold: int = Field(default=5, ge=1, le=100_000)
    """How many such calls are admitted in a window; the next one is refused."""
    window: int = 600
    """Seconds (or "1m", "1h", ...), aligned to the epoch in UTC."""
    on_detect: Literal["deny", "pause_run"] = "deny"
    """`deny`: refuse the call; `pause_run`: refuse it and stop its run (a call in no run is only refused)."""

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_loop(cls, data: Any, handler: ModelWrapValidatorHandler[LoopRule]) -> LoopRule:
        return _named("loop", data, handler)

    @field_validator("ignore")
    @classmethod
    def _fields(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("must name argument fields, not blanks")
        return value

    @field_validator("window", mode="before", json_schema_input_type=_DURATION_INPUT)
    @classmethod
    def _window(cls, value: object) -> int:
        return parse_duration(value)

    @model_validator(mode="after")
    def _ignore_counts_calls(self) -> LoopRule:
        if self.count == "failures" and self.ignore:
            raise ValueError(f"loop {self.id!r}: ignore: a rule counting failures ignores every argument")
        return self

    @property
    def kind(self) -> Literal["repeated_action", "near_identical", "repeated_failure"]:
        if self.count == "failures":
            return "repeated_failure"
        return "near_identical" if self.ignore else "repeated_action"


_ID_SPACES = {"rules": ("rule", "rule"), "budgets": ("budget", "budget"), "loops": ("loop", "loop rule")}
"""Each list's ids are its own: what an item is called in an error, and what it is unique among."""


class PolicyConfig(_Strict):
    """The `policy:` section: an ordered list of rules. No rules means every call is denied."""

    rules: list[Rule] = Field(default_factory=list)
    budgets: list[Budget] = Field(default_factory=list)
    """Limits counted in the store; a call over any of them is refused `budget_exceeded`."""
    loops: list[LoopRule] = Field(default_factory=list)
    """Repeated and near-identical calls looked for in the store; a loop is refused `loop_detected`."""

    @field_validator("rules", "budgets", "loops")
    @classmethod
    def _ids_unique(cls, items: list[Rule] | list[Budget] | list[LoopRule], info: ValidationInfo) -> Any:
        kind, among = _ID_SPACES[info.field_name or ""]
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"{kind} {item.id!r}: id: used by more than one {among}")
            seen.add(item.id)
        return items

    def canonical(self) -> dict[str, Any]:
        """The rules as plain JSON with every default filled in: what the policy version hashes."""
        data = self.model_dump(mode="json")
        if not self.budgets:
            # A policy without budgets keeps the version it had before budgets existed.
            del data["budgets"]
        if not self.loops:
            del data["loops"]
        for rule in data["rules"]:
            # Likewise a rule about tools keeps its spelling from before resource and prompt rules.
            for field in ("resources", "prompts"):
                if rule[field] is None:
                    del rule[field]
        return data
