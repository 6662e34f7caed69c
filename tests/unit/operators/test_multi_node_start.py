"""The platform refuses to start on several nodes with state each node would keep for itself:
the SQLite file under DATA_DIR, or job results under DATA_DIR/results."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.app import build_app
from serve_app.settings import Settings
from serve_app.shared_state import PerNodeState, multi_node_findings, refuse_per_node_state

POSTGRES = "postgresql://platform:secret@db.internal:5432/platform"
BUCKET = "s3://results/platform?endpoint=http://minio.internal:9000"


def _settings(tmp_path: Path, **given: object) -> Settings:
    return Settings(data_dir=tmp_path, **given)


def test_one_node_starts_on_sqlite_and_a_local_result_store(tmp_path):
    refuse_per_node_state(_settings(tmp_path), nodes=1, declared=False)


def test_several_nodes_on_sqlite_are_refused_saying_what_to_set(tmp_path):
    with pytest.raises(PerNodeState) as refused:
        refuse_per_node_state(_settings(tmp_path, result_store_url=BUCKET), nodes=3,
                              declared=False)
    message = str(refused.value)
    assert "3 Ray nodes" in message
    assert "DATABASE_URL: a SQLite file (DATA_DIR/platform.db)" in message
    assert "set DATABASE_URL=postgresql://" in message
    assert "RESULT_STORE_URL" not in message


def test_several_nodes_without_a_shared_result_store_are_refused(tmp_path):
    with pytest.raises(PerNodeState) as refused:
        refuse_per_node_state(_settings(tmp_path, database_url=POSTGRES), nodes=2,
                              declared=False)
    message = str(refused.value)
    assert "RESULT_STORE_URL: unset" in message and "set RESULT_STORE_URL=s3://" in message
    assert "DATABASE_URL" not in message


def test_a_config_that_declares_several_nodes_is_refused_on_the_head_alone(tmp_path):
    """An autoscaled cluster starts on its head: the config says what is coming."""
    with pytest.raises(PerNodeState, match=r"the config's multi_node: true"):
        refuse_per_node_state(_settings(tmp_path), nodes=1, declared=True)


def test_several_nodes_on_postgresql_and_a_bucket_start(tmp_path):
    settings = _settings(tmp_path, database_url=POSTGRES, result_store_url=BUCKET)
    refuse_per_node_state(settings, nodes=4, declared=True)


def test_a_result_directory_named_by_the_operator_is_taken_as_a_shared_volume(tmp_path):
    settings = _settings(tmp_path, database_url=POSTGRES, result_store_url="/mnt/shared")
    refuse_per_node_state(settings, nodes=2, declared=True)
    (store,) = [f for f in multi_node_findings(settings) if f.subject == "RESULT_STORE_URL"]
    assert store.level == "WARNING" and "every node must mount" in store.text


def test_build_app_refuses_a_multi_node_config_on_sqlite_before_creating_the_database(
        tmp_path):
    with pytest.raises(PerNodeState, match="DATABASE_URL=postgresql://"):
        build_app({"settings": {"data_dir": str(tmp_path)}, "model_deployments": [],
                   "multi_node": True})
    assert not (tmp_path / "platform.db").exists()
