"""`python -m deployments.weights prepare [--catalog FILE] [--data-dir DIR]`: build the weights
the catalog says how to build (`engine_options.build`), with progress on the console (copies,
where `make install` built them ahead).

`python -m deployments.weights prebuild [--catalog FILE] [--into DIR]`: build them ahead, one
folder per builder (`make install` does, into .cache/weights).

The catalog and data folder default as the platform's settings do: MODEL_CATALOG
(configs/models.yaml) and DATA_DIR (./data). Only the models' `id`, `weights` and
`engine_options` are read here; the Gateway validates the whole catalog.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.catalog_file import read_catalog_file
from deployments.weights.registry import prebuild_all, prepare_all
from deployments.weights.store import PREBUILT_DIR, expand_spec

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RawEngineOptions:
    """A model's `engine_options` as the YAML holds them (an `EngineOptionsView`)."""

    values: dict[str, Any] = field(default_factory=dict)

    @property
    def build(self) -> str | None:
        return self.values.get("build")

    def given(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class CatalogEntry:
    """A catalog model as far as building its weights goes (a `ServedModel`)."""

    id: str
    engine: str = ""
    weights: str | None = None
    engine_options: RawEngineOptions = field(default_factory=RawEngineOptions)

    def weights_spec(self, data_dir: Path) -> str | None:
        return expand_spec(self.weights, data_dir)


def read_catalog(path: Path) -> list[CatalogEntry]:
    """The catalog's models as the Gateway reads them (`include:` and `model_overrides`
    applied: deployments/catalog_file.py)."""
    return [CatalogEntry(id=m["id"], engine=m.get("engine", ""), weights=m.get("weights"),
                         engine_options=RawEngineOptions(dict(m.get("engine_options") or {})))
            for m in read_catalog_file(path).get("models", [])]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m deployments.weights",
        description="Build the weights a model catalog says how to build "
                    "(`engine_options.build`), with progress.")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="build the weights the catalog asks for")
    prebuild = commands.add_parser("prebuild", help="build them ahead, one folder per builder")
    for command in (prepare, prebuild):
        command.add_argument("--catalog", type=Path, default=Path(os.environ.get(
            "MODEL_CATALOG", PROJECT_ROOT / "configs" / "models.yaml")),
            help="the model catalog (default: $MODEL_CATALOG or configs/models.yaml)")
    prebuild.add_argument("--into", type=Path, default=PREBUILT_DIR,
                          help=f"where (default: {PREBUILT_DIR.relative_to(PROJECT_ROOT)})")
    prepare.add_argument("--data-dir", type=Path,
                         default=Path(os.environ.get("DATA_DIR", "./data")),
                         help="where ${DATA_DIR} of the catalog points (default: $DATA_DIR "
                              "or ./data)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    catalog = read_catalog(args.catalog.expanduser().resolve())
    if args.command == "prebuild":
        prebuild_all(catalog, args.into.expanduser().resolve())
    else:
        prepare_all(catalog, args.data_dir.expanduser().resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
