"""Reading a catalog file into plain data, as both its readers need it: the Gateway, which
types and checks the whole (serve_app/models/catalog.py), and the weights builder, which reads
only what building needs (deployments/weights). One reader, so both see the same models.

A file may `include:` others (paths relative to it), whose models come first; its own models
follow, one of the same id replacing the included one; then its `model_overrides` change
fields of models it lists or includes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_catalog_file(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A catalog file's contents, with the catalogs it names in `include:` (paths relative to
    it) first: a file adds models to another (configs/models.production.yaml adds the models
    only GPUs serve to configs/models.yaml), a model of the same id replaces the included one,
    trait and alias entries are merged, other sections replaced. Its `model_overrides:` then
    change fields of models it lists or includes (`_overridden`)."""
    path = path.resolve()
    if path in _seen:
        raise ValueError(f"catalog {path} includes itself")
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    merged: dict[str, Any] = {}
    for name in raw.pop("include", None) or []:
        merged = _overlaid(merged, read_catalog_file(path.parent / name, (*_seen, path)))
    overrides = raw.pop("model_overrides", None) or {}
    return _overridden(_overlaid(merged, raw), overrides, path)


def _overlaid(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = {**base, **top}
    if "models" in base or "models" in top:
        models = {m["id"]: m for m in base.get("models", [])}
        models.update({m["id"]: m for m in top.get("models", [])})
        out["models"] = list(models.values())
    for section in ("traits", "compatibility_mapping"):
        if section in base or section in top:
            merged = {kind: dict(entries) for kind, entries in base.get(section, {}).items()}
            for kind, entries in top.get(section, {}).items():
                merged.setdefault(kind, {}).update(entries)
            out[section] = merged
    return out


def _overridden(catalog: dict[str, Any], overrides: dict[str, Any], path: Path) -> dict[str, Any]:
    """The catalog with `model_overrides` (model id -> fields) applied: a field whose old and
    new values are both mappings gets the new keys over the old ones (`engine_options:
    {cpus: [-1]}` adds `cpus` and keeps `threads`), any other field is replaced. So one machine's
    catalog changes an option of a model it includes without a second copy of its entry."""
    if not isinstance(overrides, dict):
        raise ValueError(f"catalog {path}: model_overrides must map model ids to fields")
    if not overrides:
        return catalog
    models = {m["id"]: m for m in catalog.get("models", [])}
    for model_id, fields in overrides.items():
        if model_id not in models:
            raise ValueError(f"catalog {path}: model_overrides names unknown model {model_id!r}")
        if not isinstance(fields, dict):
            raise ValueError(f"catalog {path}: model_overrides.{model_id} must be a mapping")
        if "id" in fields:
            raise ValueError(f"catalog {path}: model_overrides.{model_id} cannot change the "
                             "model's id (list a model of the new id instead)")
        entry = dict(models[model_id])
        for name, value in fields.items():
            old = entry.get(name)
            if isinstance(old, dict) and isinstance(value, dict):
                value = {**old, **value}
            entry[name] = value
        models[model_id] = entry
    return {**catalog, "models": list(models.values())}
