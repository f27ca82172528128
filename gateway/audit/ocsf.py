"""Writ's events as OCSF events, for SIEMs that ingest the Open Cybersecurity Schema Framework.

Each event type maps to one OCSF class (the table is the README's "Feeding a SIEM"): the lifecycle of
runs (started, stopped and resumed by a person), calls, approvals, confirmations and reconciliations
is API Activity; a principal revoked or restored, or an OAuth client's sign-ins revoked, is Account
Change; a budget exceeded or a loop detected is a Detection Finding; a failed authentication
(`security.auth_failed`) and a refusal at Writ's own authorization server (`security.oauth_refused`)
are Authentication (Logon, Failure); a call to an unknown tool is API Activity (Failure); a request
refused at the edge is HTTP Activity (Failure); a type this table does not know yet is a Base Event,
never dropped. The Writ envelope, hashes included, rides along whole in `unmapped.writ`, so the OCSF
line still proves what the log holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.events import parse_ts

OCSF_VERSION = "1.3.0"
OTHER = 99


@dataclass(frozen=True, slots=True)
class OcsfClass:
    uid: int
    name: str
    category_uid: int
    category_name: str


API_ACTIVITY = OcsfClass(6003, "API Activity", 6, "Application Activity")
ACCOUNT_CHANGE = OcsfClass(3001, "Account Change", 3, "Identity & Access Management")
DETECTION_FINDING = OcsfClass(2004, "Detection Finding", 2, "Findings")
AUTHENTICATION = OcsfClass(3002, "Authentication", 3, "Identity & Access Management")
HTTP_ACTIVITY = OcsfClass(4002, "HTTP Activity", 4, "Network Activity")
BASE_EVENT = OcsfClass(0, "Base Event", 0, "Uncategorized")

_EXACT: dict[str, tuple[OcsfClass, int, str]] = {
    "principal.revoked": (ACCOUNT_CHANGE, 5, "Disable"),
    "principal.restored": (ACCOUNT_CHANGE, 2, "Enable"),
    # Every sign-in of one OAuth client ended: its credentials withdrawn, as a disabled account's are.
    "oauth.client_revoked": (ACCOUNT_CHANGE, 5, "Disable"),
    "budget.exceeded": (DETECTION_FINDING, 1, "Create"),
    "loop.detected": (DETECTION_FINDING, 1, "Create"),
    "security.auth_failed": (AUTHENTICATION, 1, "Logon"),
    "security.unknown_tool": (API_ACTIVITY, OTHER, "security.unknown_tool"),
    "security.edge_refused": (HTTP_ACTIVITY, OTHER, "security.edge_refused"),
    # Writ's own authorization server refused a sign-in or a token request: a failed logon of a client.
    "security.oauth_refused": (AUTHENTICATION, 1, "Logon"),
}
_API_FAMILIES = ("run.", "tool_call.", "approval.", "confirmation.", "reconciliation.")
_SUCCESS = frozenset({"completed", "resolved", "granted", "given"})
_FAILURE = frozenset({"failed", "denied", "rejected", "declined", "expired"})
# Who did it: the decider, revoker, resolver or person asking for a retry where there is one, else
# the subject who asked.
_ACTORS = (
    "decided_by",
    "revoked_by",
    "restored_by",
    "resolved_by",
    "stopped_by",
    "resumed_by",
    "requested_by",
    "subject",
)


def ocsf_class(event_type: str) -> tuple[OcsfClass, int, str]:
    """The OCSF class, activity id and activity name of a Writ event type."""
    if event_type in _EXACT:
        return _EXACT[event_type]
    if event_type.startswith(_API_FAMILIES):
        return API_ACTIVITY, OTHER, event_type
    return BASE_EVENT, OTHER, event_type


def _status(event_type: str) -> tuple[int, str]:
    if event_type.startswith("security."):
        return 2, "Failure"
    last = event_type.rsplit(".", 1)[-1]
    if last in _SUCCESS:
        return 1, "Success"
    if last in _FAILURE:
        return 2, "Failure"
    return 0, "Unknown"


def _epoch_ms(occurred_at: str) -> int:
    # Whole milliseconds without a float in between, which could round .123 down to .122.
    moment = parse_ts(occurred_at)
    return int(moment.replace(microsecond=0).timestamp()) * 1000 + moment.microsecond // 1000


def ocsf_event(event: dict[str, Any]) -> dict[str, Any]:
    """One Writ envelope (as the store exports it) as one OCSF event."""
    cls, activity_id, activity_name = ocsf_class(event["type"])
    status_id, status = _status(event["type"])
    payload = event["payload"] if isinstance(event["payload"], dict) else {}
    finding = cls is DETECTION_FINDING
    out: dict[str, Any] = {
        "class_uid": cls.uid,
        "class_name": cls.name,
        "category_uid": cls.category_uid,
        "category_name": cls.category_name,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": cls.uid * 100 + activity_id,
        "time": _epoch_ms(event["occurred_at"]),
        "severity_id": 3 if finding else 1,
        "severity": "Medium" if finding else "Informational",
        "status_id": status_id,
        "status": status,
        "message": event["type"],
        "metadata": {
            "version": OCSF_VERSION,
            "product": {"name": "Writ", "vendor_name": "Writ", "uid": event["producer"]},
            "uid": event["event_id"],
            "event_code": event["type"],
            "original_time": event["occurred_at"],
            "sequence": event["seq"],
            "tenant_uid": event["tenant"],
            "correlation_uid": event["correlation_id"],
        },
        "unmapped": {"writ": event},
    }
    actor = next((payload[k] for k in _ACTORS if isinstance(payload.get(k), str)), None)
    if actor is not None:
        out["actor"] = {"user": {"uid": actor}}
    if cls is API_ACTIVITY:
        out["api"] = {"operation": event["type"], "service": {"name": event["capability_id"] or "writ"}}
    elif event["type"] == "oauth.client_revoked":
        # The account whose credentials were withdrawn is the client's, not a person's.
        out["user"] = {
            "uid": payload.get("client_id"),
            "name": payload.get("client_name"),
            "type_id": OTHER,
            "type": "OAuth client",
        }
    elif cls is ACCOUNT_CHANGE:
        out["user"] = {"uid": payload.get("subject")}
    elif finding:
        out["finding_info"] = {"uid": event["event_id"], "title": event["type"], "types": [event["type"]]}
    if event["type"].startswith("security."):
        _security(out, cls, payload)
    return out


def _security(out: dict[str, Any], cls: OcsfClass, payload: dict[str, Any]) -> None:
    """A `security.*` event's reason, source, count and claimed identity in OCSF's own fields."""
    out["status_detail"] = payload.get("kind")
    out["count"] = payload.get("count")
    out["start_time"] = _epoch_ms(payload["first_at"]) if isinstance(payload.get("first_at"), str) else None
    out["end_time"] = _epoch_ms(payload["last_at"]) if isinstance(payload.get("last_at"), str) else None
    if isinstance(payload.get("source"), str):
        out["src_endpoint"] = {"ip": payload["source"]}
    if cls is AUTHENTICATION:
        user: dict[str, Any] = {}
        if isinstance(payload.get("subject"), str):
            user["uid"] = payload["subject"]
        if isinstance(payload.get("issuer"), str):
            user["domain"] = payload["issuer"]
        if isinstance(payload.get("client_id"), str) and "uid" not in user:
            # The account that failed to sign in is the OAuth client's, not a person's.
            user.update(uid=payload["client_id"], type_id=OTHER, type="OAuth client")
        if user:
            out["user"] = user
        if isinstance(payload.get("redirect_host"), str):
            out["dst_endpoint"] = {"hostname": payload["redirect_host"]}
        out["auth_protocol"] = "OAUTH 2.0"
        out["auth_protocol_id"] = 8
    elif cls is HTTP_ACTIVITY and isinstance(payload.get("path"), str):
        out["http_request"] = {"url": {"path": payload["path"]}}
    elif cls is API_ACTIVITY and isinstance(payload.get("tool_name"), str):
        out["api"]["operation"] = f"tools/call {payload['tool_name']}"
