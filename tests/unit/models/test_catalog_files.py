"""Catalog files: one includes another, and `model_overrides` changes fields of an included
model without a second copy of its entry; the Gateway and the weights builder read the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.weights.__main__ import read_catalog
from serve_app.models.catalog import CatalogModel, load_catalog

COMMON = Path(__file__).resolve().parents[3] / "configs" / "models.common.yaml"
EMBEDDER = "text-embedding-all-minilm-l6-v2"


def embedder(path: Path) -> CatalogModel:
    found = load_catalog(path).find(EMBEDDER)
    assert found is not None
    return found


def catalog_file(tmp_path: Path, **sections: Any) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"include": [str(COMMON)], **sections}))
    return path


def test_an_override_adds_an_engine_option_and_keeps_the_others(tmp_path: Path) -> None:
    included = embedder(COMMON)
    path = catalog_file(tmp_path, model_overrides={EMBEDDER: {"engine_options": {"cpus": [-1]}}})

    overridden = embedder(path)

    assert overridden.engine_options.given() == {**included.engine_options.given(), "cpus": [-1]}
    assert overridden.engine_options.cpus == [-1]
    assert overridden.pricing == included.pricing  # the rest of the entry as included


def test_an_override_replaces_a_field_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, model_overrides={EMBEDDER: {"description": "Local."}})

    assert embedder(path).description == "Local."


def test_the_included_catalog_is_unchanged(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, model_overrides={EMBEDDER: {"engine_options": {"cpus": [0]}}})
    assert embedder(path).engine_options.cpus == [0]

    assert embedder(COMMON).engine_options.cpus is None


def test_an_override_of_a_model_the_catalog_does_not_have_fails_at_load(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, model_overrides={"text-embedding-typo": {"description": "x"}})

    with pytest.raises(ValueError, match="unknown model 'text-embedding-typo'"):
        load_catalog(path)


@pytest.mark.parametrize("overrides", [[EMBEDDER], {EMBEDDER: "cpus: [-1]"},
                                       {EMBEDDER: {"id": "another-id"}}])
def test_an_override_of_the_wrong_shape_fails_at_load(tmp_path: Path, overrides: Any) -> None:
    with pytest.raises(ValueError, match="model_overrides"):
        load_catalog(catalog_file(tmp_path, model_overrides=overrides))


def test_an_overridden_option_is_checked_like_one_written_in_the_entry(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, model_overrides={EMBEDDER: {"engine_options": {"cpus": []}}})

    with pytest.raises(ValueError, match="cpus"):
        load_catalog(path)


def test_the_weights_builder_reads_the_overrides_the_gateway_reads(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, model_overrides={EMBEDDER: {
        "weights": "${DATA_DIR}/models/my-encoder", "engine_options": {"build": "my-builder"}}})

    [built] = [m for m in read_catalog(path) if m.id == EMBEDDER]

    assert built.weights == embedder(path).weights == "${DATA_DIR}/models/my-encoder"
    assert built.engine_options.build == "my-builder"
    assert built.engine_options.given() == embedder(path).engine_options.given()
