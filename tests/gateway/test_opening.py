"""The gateway opens its store with the log partitions its config names."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.errors import ConfigurationError
from gateway.opening import open_store
from store.partitions import Partitioning, scheme_of
from tests.store.builders import call_request


def test_a_store_opened_from_the_config_appends_to_the_partitions_it_names(tmp_path: Path) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/writ.db', log: {{partition_by: tenant, buckets: 2}}}}\n"
    )

    with open_store(load_config(path)) as store:
        assert scheme_of(store.engine) == Partitioning("tenant", buckets=2)
        store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))
        heads = store.partition_heads()
        assert len(heads) == 2 and set(heads) - {""} <= {"t:acme/0", "t:acme/1"}
        assert store.verify().ok


def test_buckets_without_tenant_partitions_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text("store: {log: {buckets: 4}}\n")

    with pytest.raises(ConfigurationError, match="set partition_by to tenant"):
        load_config(path)
