"""Every event type Writ records maps to an OCSF class (a new type fails here until it is mapped), and
the classes' fields are the ones OCSF defines for them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.audit.ocsf import (
    ACCOUNT_CHANGE,
    API_ACTIVITY,
    AUTHENTICATION,
    BASE_EVENT,
    DETECTION_FINDING,
    HTTP_ACTIVITY,
    ocsf_class,
    ocsf_event,
)
from store.events import TYPE_NAMES


def envelope(event_type: str, **payload: Any) -> dict[str, Any]:
    return {
        "seq": 7,
        "event_id": "ev-7",
        "type": event_type,
        "schema_version": 2,
        "occurred_at": "2026-11-30T12:00:00.123456Z",
        "producer": "writ-gateway",
        "run_id": None,
        "tool_call_id": None,
        "approval_id": None,
        "capability_id": None,
        "capability_version": None,
        "policy_version": None,
        "correlation_id": "corr-1",
        "causation_id": None,
        "tenant": "acme",
        "payload": payload,
        "prev_hash": "0" * 64,
        "hash": "1" * 64,
    }


@pytest.mark.parametrize("event_type", sorted(TYPE_NAMES))
def test_every_recorded_type_has_a_class_of_its_own(event_type: str) -> None:
    cls, activity_id, _ = ocsf_class(event_type)

    assert cls is not BASE_EVENT
    assert ocsf_event(envelope(event_type))["type_uid"] == cls.uid * 100 + activity_id


def test_a_revocation_is_an_account_disabled_by_its_revoker() -> None:
    out = ocsf_event(envelope("principal.revoked", subject="mallory", revoked_by="carol"))

    assert (out["class_uid"], out["activity_id"], out["type_uid"]) == (ACCOUNT_CHANGE.uid, 5, 300105)
    assert out["user"] == {"uid": "mallory"}
    assert out["actor"] == {"user": {"uid": "carol"}}


def test_a_client_revocation_is_the_client_account_disabled_by_its_revoker() -> None:
    client = "https://app.example.com/oauth/client.json"
    out = ocsf_event(
        envelope(
            "oauth.client_revoked",
            client_id=client,
            client_name="Example",
            revoked_by="root",
            sign_ins_ended=2,
        )
    )

    assert (out["class_uid"], out["activity_id"], out["type_uid"]) == (ACCOUNT_CHANGE.uid, 5, 300105)
    assert out["user"] == {"uid": client, "name": "Example", "type_id": 99, "type": "OAuth client"}
    assert out["actor"] == {"user": {"uid": "root"}}


def test_a_loop_is_a_detection_finding_and_a_call_an_api_activity() -> None:
    loop = ocsf_event(envelope("loop.detected"))
    granted = ocsf_event(envelope("approval.granted", decided_by="carol"))

    assert (loop["class_uid"], loop["severity_id"], loop["finding_info"]["uid"]) == (
        DETECTION_FINDING.uid,
        3,
        "ev-7",
    )
    assert (granted["class_uid"], granted["status_id"], granted["actor"]) == (
        API_ACTIVITY.uid,
        1,
        {"user": {"uid": "carol"}},
    )
    assert granted["time"] == 1796040000123


def test_a_type_not_yet_mapped_is_a_base_event_not_dropped() -> None:
    out = ocsf_event(envelope("security.something_new"))

    assert (out["class_uid"], out["type_uid"], out["unmapped"]["writ"]["type"]) == (
        0,
        99,
        "security.something_new",
    )


def security_envelope(event_type: str, **payload: Any) -> dict[str, Any]:
    window = {
        "count": 412,
        "first_at": "2026-11-30T11:59:01.000000Z",
        "last_at": "2026-11-30T12:00:00.123456Z",
    }
    return envelope(event_type, **{"window_s": 60.0, "source": "203.0.113.9", **window, **payload})


def test_a_failed_authentication_is_a_failed_logon_with_its_reason_source_and_count() -> None:
    out = ocsf_event(
        security_envelope("security.auth_failed", kind="expired", subject="mallory", issuer="https://idp")
    )

    assert (out["class_uid"], out["activity_id"], out["type_uid"]) == (AUTHENTICATION.uid, 1, 300201)
    assert (out["status_id"], out["status"], out["status_detail"]) == (2, "Failure", "expired")
    assert out["src_endpoint"] == {"ip": "203.0.113.9"}
    assert out["user"] == {"uid": "mallory", "domain": "https://idp"}
    assert out["count"] == 412
    assert (out["start_time"], out["end_time"]) == (1796039941000, 1796040000123)


def test_an_edge_refusal_is_failed_http_activity_and_an_unknown_tool_failed_api_activity() -> None:
    edge = ocsf_event(security_envelope("security.edge_refused", kind="request_too_large", path="/api/x"))
    unknown = ocsf_event(security_envelope("security.unknown_tool", kind="unknown_tool", tool_name="rm"))

    assert (edge["class_uid"], edge["status"], edge["http_request"]) == (
        HTTP_ACTIVITY.uid,
        "Failure",
        {"url": {"path": "/api/x"}},
    )
    assert (unknown["class_uid"], unknown["status"], unknown["api"]["operation"]) == (
        API_ACTIVITY.uid,
        "Failure",
        "tools/call rm",
    )


def test_a_run_stopped_is_an_api_activity_by_the_person_who_stopped_it() -> None:
    out = ocsf_event(envelope("run.stopped", stopped_by="carol", reason="runaway"))
    resumed = ocsf_event(envelope("run.resumed", resumed_by="dave", reason="fixed"))

    assert (out["class_uid"], out["api"]["operation"]) == (API_ACTIVITY.uid, "run.stopped")
    assert out["actor"] == {"user": {"uid": "carol"}}
    assert resumed["actor"] == {"user": {"uid": "dave"}}


def test_a_retry_requested_is_an_api_activity_by_the_person_who_asked_not_the_caller() -> None:
    out = ocsf_event(
        envelope("tool_call.retry_requested", requested_by="carol", subject="alice", retry_tool_call_id="r")
    )

    assert (out["class_uid"], out["api"]["operation"]) == (API_ACTIVITY.uid, "tool_call.retry_requested")
    assert out["actor"] == {"user": {"uid": "carol"}}
