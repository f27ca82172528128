"""acme-payments, the demo backend, run as a real subprocess and driven over HTTP."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import httpx2
import pytest
from starlette.types import Message, Receive, Scope, Send

from demo.acme_chaos import DROP_SCOPE_KEY, ConnectionDropper
from tests.eventually import eventually_sync

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 10.0


@dataclass
class RunningBackend:
    url: str
    process: subprocess.Popen[str]
    stderr_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        assert self.process.stdout is not None
        self.process.stdout.close()


def start_backend(db_path: Path, stderr_path: Path, *options: str) -> RunningBackend:
    """Start acme-payments on a port of its choosing and wait (bounded) for its "listening" line."""
    with stderr_path.open("a") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "demo.acme_payments", "--port", "0", "--db", str(db_path), *options],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    backend = RunningBackend(url="", process=process, stderr_path=stderr_path)
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    line = ""
    while not line and time.monotonic() < deadline and process.poll() is None:
        readable, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
        if readable:
            line = process.stdout.readline()
    if not line.startswith("acme-payments listening on http://127.0.0.1:"):
        backend.stop()
        pytest.fail(f"acme-payments did not start: {line!r}\n{stderr_path.read_text()}")
    backend.url = line.removeprefix("acme-payments listening on ").strip()
    return backend


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "acme.db"


@pytest.fixture
def backend(db_path: Path, tmp_path: Path) -> Iterator[RunningBackend]:
    running = start_backend(db_path, tmp_path / "acme.stderr")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr_path.read_text()


@pytest.fixture
def client(backend: RunningBackend) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=backend.url, timeout=HTTP_TIMEOUT_S) as http:
        yield http


def refund(
    client: httpx2.Client,
    *,
    key: str | None = "key-1",
    order_id: object = "1001",
    amount: object = 20.0,
    currency: str = "EUR",
    reason: str = "damaged",
    timeout: float = HTTP_TIMEOUT_S,
    deadline: str | None = None,
) -> httpx2.Response:
    headers = {"X-Request-Id": f"req-{uuid.uuid4()}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if deadline is not None:
        headers["Writ-Commit-Deadline"] = deadline
    body = {"order_id": order_id, "amount": amount, "currency": currency, "reason": reason}
    return client.post("/refunds", json=body, headers=headers, timeout=timeout)


def refunds_with_key(client: httpx2.Client, key: str) -> list[dict[str, object]]:
    response = client.get("/refunds", params={"idempotency_key": key})
    assert response.status_code == 200
    return response.json()["refunds"]


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), as /proc says."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def set_chaos(client: httpx2.Client, **state: int) -> None:
    response = client.post("/_chaos", json=state)
    assert response.status_code == 200, response.text


def in_(seconds: float) -> tuple[datetime, str]:
    """A deadline `seconds` from now, and the header text Writ would send for it."""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return at, at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_healthz_answers_ok(client: httpx2.Client) -> None:
    assert client.get("/healthz").json() == {"ok": True}


def test_a_seeded_order_can_be_looked_up_by_id(client: httpx2.Client) -> None:
    response = client.get("/orders/1003")

    assert response.status_code == 200
    assert response.json() == {
        "order_id": "1003",
        "customer": "Katherine Johnson",
        "amount": 25000.0,
        "currency": "USD",
        "status": "paid",
        "refunded_total": 0.0,
    }


def test_all_ten_orders_are_seeded(client: httpx2.Client) -> None:
    for order_id in range(1001, 1011):
        assert client.get(f"/orders/{order_id}").status_code == 200


def test_an_unknown_order_is_not_found(client: httpx2.Client) -> None:
    response = client.get("/orders/999")

    assert response.status_code == 404
    assert response.json()["error"] == "order_not_found"


def test_a_valid_refund_is_executed_and_counted_against_the_order(client: httpx2.Client) -> None:
    response = client.post(
        "/refunds",
        json={"order_id": "1001", "amount": 20.5, "currency": "EUR", "reason": "damaged"},
        headers={"Idempotency-Key": "key-1", "X-Request-Id": "req-1"},
    )

    assert response.status_code == 201
    body = response.json()
    assert body["refund_id"].startswith("rf_")
    assert body["created_at"]
    assert {k: body[k] for k in body if k not in {"refund_id", "created_at"}} == {
        "order_id": "1001",
        "amount": 20.5,
        "currency": "EUR",
        "reason": "damaged",
        "idempotency_key": "key-1",
        "request_id": "req-1",
        "status": "succeeded",
    }
    order = client.get("/orders/1001").json()
    assert order["refunded_total"] == 20.5
    assert order["status"] == "partially_refunded"


def test_an_integer_order_id_and_a_decimal_string_amount_are_accepted(client: httpx2.Client) -> None:
    response = refund(client, order_id=1002, amount="5000.00")

    assert response.status_code == 201
    assert client.get("/orders/1002").json()["status"] == "refunded"


def test_a_refund_without_an_idempotency_key_is_refused(client: httpx2.Client) -> None:
    response = refund(client, key=None)

    assert response.status_code == 400
    assert response.json()["error"] == "idempotency_key_required"
    assert client.get("/refunds").json() == {"refunds": []}


def test_a_refund_for_an_unknown_order_is_not_found(client: httpx2.Client) -> None:
    response = refund(client, order_id="999")

    assert response.status_code == 404
    assert response.json()["error"] == "order_not_found"


def test_a_refund_in_another_currency_than_the_order_is_unprocessable(client: httpx2.Client) -> None:
    response = refund(client, order_id="1001", currency="USD")

    assert response.status_code == 422
    assert response.json()["error"] == "currency_mismatch"
    assert "EUR" in response.json()["detail"]


@pytest.mark.parametrize("amount", [0, -5, "abc", 1.234, True, None])
def test_an_amount_that_is_not_a_positive_sum_of_cents_is_unprocessable(
    client: httpx2.Client, amount: object
) -> None:
    response = refund(client, amount=amount)

    assert response.status_code == 422
    assert response.json()["error"] == "invalid_amount"


def test_a_refund_above_what_is_left_to_refund_is_unprocessable(client: httpx2.Client) -> None:
    assert refund(client, key="first", amount=100).status_code == 201

    response = refund(client, key="second", amount=20.01)

    assert response.status_code == 422
    assert response.json()["error"] == "exceeds_refundable"
    assert client.get("/orders/1001").json()["refunded_total"] == 100.0
    assert refund(client, key="third", amount=20).status_code == 201


def test_two_posts_with_the_same_idempotency_key_execute_two_refunds(client: httpx2.Client) -> None:
    first = refund(client, key="same-key", amount=10)
    second = refund(client, key="same-key", amount=10)

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["refund_id"] != second.json()["refund_id"]
    assert len(refunds_with_key(client, "same-key")) == 2
    assert client.get("/orders/1001").json()["refunded_total"] == 20.0


@pytest.fixture
def deduping(db_path: Path, tmp_path: Path) -> Iterator[httpx2.Client]:
    """A client of acme-payments run with `--dedupe`."""
    running = start_backend(db_path, tmp_path / "acme.stderr", "--dedupe")
    try:
        with httpx2.Client(base_url=running.url, timeout=HTTP_TIMEOUT_S) as http:
            yield http
    finally:
        running.stop()
    assert "Traceback" not in running.stderr_path.read_text()


def test_with_dedupe_a_key_executed_before_is_answered_with_its_refund_and_nothing_runs(
    deduping: httpx2.Client,
) -> None:
    first = refund(deduping, key="same-key", amount=10)
    second = refund(deduping, key="same-key", amount=20, reason="another")
    other = refund(deduping, key="other-key", amount=10)

    assert (first.status_code, second.status_code, other.status_code) == (201, 201, 201)
    assert second.json() == first.json() and second.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert other.json()["refund_id"] != first.json()["refund_id"]
    assert len(refunds_with_key(deduping, "same-key")) == 1
    assert deduping.get("/orders/1001").json()["refunded_total"] == 20.0


def test_with_dedupe_a_key_is_answered_with_its_refund_when_the_order_has_nothing_left_to_refund(
    deduping: httpx2.Client,
) -> None:
    first = refund(deduping, key="all", amount=120)

    again = refund(deduping, key="all", amount=120)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["refund_id"] == first.json()["refund_id"]


def test_with_dedupe_concurrent_refunds_under_one_key_execute_once(deduping: httpx2.Client) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: refund(deduping, key="racing", amount=10), range(8)))

    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["refund_id"] for a in answers}) == 1
    assert len(refunds_with_key(deduping, "racing")) == 1
    assert deduping.get("/orders/1001").json()["refunded_total"] == 10.0


def test_refunds_are_listed_oldest_first_and_can_be_filtered_by_idempotency_key(
    client: httpx2.Client,
) -> None:
    ids = [refund(client, key=key, amount=1, reason=f"r-{key}").json()["refund_id"] for key in "abca"]

    everything = client.get("/refunds").json()["refunds"]
    only_a = refunds_with_key(client, "a")

    assert [r["refund_id"] for r in everything] == ids
    assert [r["reason"] for r in everything] == ["r-a", "r-b", "r-c", "r-a"]
    assert [r["refund_id"] for r in only_a] == [ids[0], ids[3]]
    assert {r["idempotency_key"] for r in only_a} == {"a"}
    assert refunds_with_key(client, "never-used") == []


def test_a_chaos_post_replaces_the_whole_state_and_is_read_back(client: httpx2.Client) -> None:
    calm = {"drop_responses": 0, "delay_ms": 0, "commit_delay_ms": 0, "fail_after_commit": 0, "hang": 0}
    calm |= {"freeze": 0, "ignore_deadline": 0}
    assert client.get("/_chaos").json() == calm

    posted = client.post("/_chaos", json={"drop_responses": 2, "delay_ms": 50})
    replaced = client.post("/_chaos", json={"hang": 1})

    assert posted.json() == calm | {"drop_responses": 2, "delay_ms": 50}
    assert replaced.json() == calm | {"hang": 1}
    assert client.get("/_chaos").json() == replaced.json()


@pytest.mark.parametrize("state", [{"hang": -1}, {"hang": "1"}, {"explode": 1}, [1]])
def test_an_invalid_chaos_state_is_unprocessable(client: httpx2.Client, state: object) -> None:
    response = client.post("/_chaos", json=state)

    assert response.status_code == 422
    assert response.json()["error"] == "invalid_chaos"


def test_a_dropped_response_leaves_the_client_without_an_answer_but_the_refund_committed(
    client: httpx2.Client,
) -> None:
    set_chaos(client, drop_responses=1)

    with pytest.raises(httpx2.RemoteProtocolError):
        refund(client, key="dropped", amount=30)

    assert [r["amount"] for r in refunds_with_key(client, "dropped")] == [30.0]
    assert client.get("/orders/1001").json()["refunded_total"] == 30.0
    assert client.get("/_chaos").json()["drop_responses"] == 0
    assert refund(client, key="after-drop", amount=1).status_code == 201


def test_a_failure_after_commit_answers_500_but_the_refund_committed(client: httpx2.Client) -> None:
    set_chaos(client, fail_after_commit=1)

    response = refund(client, key="failed", amount=40)

    assert response.status_code == 500
    assert response.json() == {"error": "internal"}
    assert len(refunds_with_key(client, "failed")) == 1
    assert client.get("/orders/1001").json()["refunded_total"] == 40.0
    assert refund(client, key="after-failure", amount=1).status_code == 201


def test_a_delayed_response_times_out_the_client_but_the_refund_committed(client: httpx2.Client) -> None:
    set_chaos(client, delay_ms=3000)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="slow", amount=50, timeout=0.5)

    assert len(refunds_with_key(client, "slow")) == 1
    assert client.get("/orders/1001").json()["refunded_total"] == 50.0


def test_a_held_refund_is_listed_as_held_until_it_commits(client: httpx2.Client) -> None:
    set_chaos(client, commit_delay_ms=1500)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="queued", amount=70, timeout=0.3)

    # Nothing yet: the refund is still in the queue, and says so, while its client is long gone.
    assert refunds_with_key(client, "queued") == []
    assert client.get("/_chaos/held").json() == {"held": ["queued"]}
    eventually_sync(lambda: not client.get("/_chaos/held").json()["held"])
    assert [r["amount"] for r in refunds_with_key(client, "queued")] == [70.0]
    assert client.get("/_chaos/held").json() == {"held": []}


def test_a_frozen_backend_runs_the_refund_once_woken_although_its_client_gave_up(
    client: httpx2.Client, backend: RunningBackend
) -> None:
    set_chaos(client, freeze=1)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="frozen", amount=80, timeout=0.5)
    try:
        # It stops by itself, the refund read and not run.
        eventually_sync(lambda: stopped(backend.process.pid), within_s=10)
    finally:
        os.kill(backend.process.pid, signal.SIGCONT)

    eventually_sync(lambda: len(refunds_with_key(client, "frozen")) == 1)
    assert [r["amount"] for r in refunds_with_key(client, "frozen")] == [80.0]
    assert client.get("/_chaos").json()["freeze"] == 0


def test_a_refund_held_before_its_commit_commits_after_the_client_gave_up(client: httpx2.Client) -> None:
    set_chaos(client, commit_delay_ms=1500)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="held", amount=50, timeout=0.5)
    assert refunds_with_key(client, "held") == []  # not yet: a lookup now finds nothing

    eventually_sync(lambda: refunds_with_key(client, "held"))  # it commits on its own
    assert client.get("/orders/1001").json()["refunded_total"] == 50.0


def test_a_refund_committing_before_its_commit_deadline_is_executed(client: httpx2.Client) -> None:
    _, deadline = in_(30)

    response = refund(client, key="in-time", amount=10, deadline=deadline)

    assert response.status_code == 201, response.text
    assert len(refunds_with_key(client, "in-time")) == 1


def test_a_refund_held_past_its_commit_deadline_is_refused_and_never_found(client: httpx2.Client) -> None:
    set_chaos(client, commit_delay_ms=1000)
    _, deadline = in_(0.3)

    response = refund(client, key="too-late", amount=50, deadline=deadline)

    assert response.status_code == 422, response.text
    assert response.json()["error"] == "commit_deadline_passed"
    assert "nothing was refunded" in response.json()["detail"]
    assert refunds_with_key(client, "too-late") == []
    assert client.get("/_chaos/held").json() == {"held": []}
    assert client.get("/orders/1001").json()["refunded_total"] == 0.0


def test_a_refund_frozen_past_its_commit_deadline_is_refused_once_woken(
    client: httpx2.Client, backend: RunningBackend
) -> None:
    set_chaos(client, freeze=1)
    at, deadline = in_(0.5)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="frozen-late", amount=80, timeout=0.3, deadline=deadline)
    try:
        eventually_sync(lambda: stopped(backend.process.pid), within_s=10)
        eventually_sync(lambda: datetime.now(UTC) > at)  # frozen until its deadline has passed
    finally:
        os.kill(backend.process.pid, signal.SIGCONT)

    eventually_sync(lambda: not client.get("/_chaos/held").json()["held"])
    assert refunds_with_key(client, "frozen-late") == []
    assert client.get("/orders/1001").json()["refunded_total"] == 0.0


def test_ignore_deadline_makes_the_next_refund_commit_past_its_deadline_although_chaos_was_reset(
    client: httpx2.Client,
) -> None:
    set_chaos(client, commit_delay_ms=1000, ignore_deadline=1)
    _, deadline = in_(0.3)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="lied", amount=30, timeout=0.3, deadline=deadline)
    set_chaos(client)  # decided when the refund was read: it still commits late

    eventually_sync(lambda: refunds_with_key(client, "lied"))
    assert [r["amount"] for r in refunds_with_key(client, "lied")] == [30.0]
    set_chaos(client, commit_delay_ms=1000)
    assert refund(client, key="honest", amount=1, deadline=in_(0.3)[1]).status_code == 422


@pytest.mark.parametrize("deadline", ["tomorrow", "2026-12-01T15:40:00"])
def test_a_commit_deadline_that_is_not_an_rfc_3339_instant_is_a_bad_request(
    client: httpx2.Client, deadline: str
) -> None:
    response = refund(client, key="odd-deadline", deadline=deadline)

    assert response.status_code == 400
    assert response.json()["error"] == "invalid_commit_deadline"
    assert refunds_with_key(client, "odd-deadline") == []


def test_a_hanging_refund_executes_nothing_and_uses_up_its_counter(client: httpx2.Client) -> None:
    set_chaos(client, hang=1)

    with pytest.raises(httpx2.ReadTimeout):
        refund(client, key="hung", amount=60, timeout=0.5)

    assert refunds_with_key(client, "hung") == []
    assert client.get("/orders/1001").json()["refunded_total"] == 0.0
    assert client.get("/_chaos").json()["hang"] == 0
    assert refund(client, key="after-hang", amount=60).status_code == 201


def test_chaos_counters_are_not_used_up_by_refunds_that_fail_validation(client: httpx2.Client) -> None:
    set_chaos(client, fail_after_commit=1)

    assert refund(client, currency="USD").status_code == 422

    assert client.get("/_chaos").json()["fail_after_commit"] == 1


def test_concurrent_refunds_never_refund_more_than_the_order_amount(client: httpx2.Client) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda i: refund(client, key=f"c-{i}", amount=30).status_code, range(8)))

    assert sorted(statuses) == [201] * 4 + [422] * 4
    order = client.get("/orders/1001").json()
    assert (order["refunded_total"], order["status"]) == (120.0, "refunded")


def test_orders_and_refunds_survive_a_restart_on_the_same_db_file(db_path: Path, tmp_path: Path) -> None:
    first = start_backend(db_path, tmp_path / "first.stderr")
    try:
        with httpx2.Client(base_url=first.url, timeout=HTTP_TIMEOUT_S) as http:
            executed = refund(http, key="durable", amount=25).json()
    finally:
        first.stop()

    second = start_backend(db_path, tmp_path / "second.stderr")
    try:
        with httpx2.Client(base_url=second.url, timeout=HTTP_TIMEOUT_S) as http:
            assert refunds_with_key(http, "durable") == [executed]
            assert http.get("/orders/1001").json()["refunded_total"] == 25.0
            assert http.get("/orders/1010").json()["refunded_total"] == 0.0
            assert len(http.get("/refunds").json()["refunds"]) == 1
    finally:
        second.stop()


@pytest.mark.anyio
async def test_without_a_server_transport_a_dropped_response_is_started_and_never_finished() -> None:
    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await scope[DROP_SCOPE_KEY]()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:  # a plain function: no cycle, no transport
        sent.append(message)

    with anyio.fail_after(5):
        await ConnectionDropper(endpoint)({"type": "http"}, receive, send)

    assert sent == [{"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"1")]}]
