"""Rate-limit buckets in the store: burst, refill, retry-after, and one count shared by every replica."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from store import Store
from store.rate_limits import Bucket

T0 = 1_800_000_000.0


def test_a_burst_passes_then_the_next_call_is_told_when_one_will_pass(store: Store) -> None:
    bucket = [Bucket("acme/alice", per_s=2, burst=3)]

    assert [store.take_tokens(bucket, now=T0) for _ in range(3)] == [None, None, None]
    assert store.take_tokens(bucket, now=T0) == pytest.approx(0.5)
    assert store.take_tokens(bucket, now=T0 + 0.25) == pytest.approx(0.25)
    assert store.take_tokens(bucket, now=T0 + 0.5) is None  # refilled at 2 per second
    assert store.take_tokens(bucket, now=T0 + 0.5) == pytest.approx(0.5)


def test_a_refused_call_takes_nothing_from_any_of_its_buckets(store: Store) -> None:
    tool = Bucket("acme/alice/refund_order", per_s=1, burst=1)
    everything = Bucket("acme/alice", per_s=1, burst=5)
    assert store.take_tokens([tool, everything], now=T0) is None
    assert store.take_tokens([tool, everything], now=T0) == pytest.approx(1.0)
    # The principal's own bucket lost only the one call that passed: four more fit.
    assert [store.take_tokens([everything], now=T0) for _ in range(5)] == [None] * 4 + [pytest.approx(1.0)]


def test_buckets_of_other_principals_are_independent(store: Store) -> None:
    assert store.take_tokens([Bucket("acme/alice", per_s=1, burst=1)], now=T0) is None
    assert store.take_tokens([Bucket("acme/bob", per_s=1, burst=1)], now=T0) is None
    assert store.take_tokens([Bucket("acme/alice", per_s=1, burst=1)], now=T0) is not None


def test_a_clock_behind_the_bucket_never_refills_it(store: Store) -> None:
    bucket = [Bucket("k", per_s=1, burst=1)]
    assert store.take_tokens(bucket, now=T0) is None
    assert store.take_tokens(bucket, now=T0 - 60) is not None  # a replica whose clock is behind


def test_replicas_racing_for_one_bucket_let_exactly_its_burst_through(store_url: str) -> None:
    # Two stores (two engines, two pools) stand for two replicas; 16 threads race for 10 tokens.
    with Store.open(store_url) as first, Store.open(store_url) as second:
        first.migrate()
        bucket = [Bucket("acme/mallory", per_s=0.001, burst=10)]

        def take(n: int) -> float | None:
            return (first if n % 2 else second).take_tokens(bucket, now=T0)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(take, range(64)))
    assert answers.count(None) == 10


def test_the_buckets_are_an_unlogged_table_on_postgresql(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url) as store:
        store.migrate()
        with store.engine.connect() as conn:
            persistence = conn.execute(
                text(
                    "SELECT relpersistence FROM pg_class WHERE relname = 'rate_buckets' AND relkind = 'r'"
                    " AND relnamespace = current_schema()::regnamespace"
                )
            ).scalar_one()
    assert persistence == "u"
