"""The published reference interface (shared/reference/venice/openapi.yaml, an OpenAPI 3.0
document) as JSON Schemas, to check that what we answer is what its clients parse.

The reference lives beside the project's checkout (`../shared`, as in CI); a test that needs it
is skipped when it is absent. OpenAPI 3.0 schemas are draft-4 JSON Schema plus `nullable`,
which is turned into a `null` type here, and `$ref`s, which are inlined.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml

from serve_app.settings import PROJECT_ROOT

REFERENCE_OPENAPI = PROJECT_ROOT.parent / "shared" / "reference" / "venice" / "openapi.yaml"


@cache
def _document() -> dict[str, Any]:
    with open(REFERENCE_OPENAPI, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def reference_document() -> dict[str, Any]:
    if not REFERENCE_OPENAPI.is_file():
        pytest.skip(f"the reference interface is not at {REFERENCE_OPENAPI}")
    return _document()


def _converted(schema: Any, document: dict[str, Any], depth: int = 0) -> Any:
    if isinstance(schema, list):
        return [_converted(item, document, depth) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        assert depth < 20, f"reference cycle at {schema['$ref']}"
        target: Any = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _converted(target, document, depth + 1)
    out = {key: _properties(value, document, depth) if key == "properties"
           else _converted(value, document, depth)
           for key, value in schema.items() if key not in ("nullable", "example", "description")}
    if schema.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _properties(properties: Any, document: dict[str, Any], depth: int) -> Any:
    """A `properties` map: its keys are field names (a field may be named `description`),
    each value a schema."""
    if not isinstance(properties, dict):
        return _converted(properties, document, depth)
    return {name: _converted(value, document, depth) for name, value in properties.items()}


def component_schema(name: str) -> dict[str, Any]:
    """`#/components/schemas/<name>` as a JSON Schema."""
    document = reference_document()
    return _converted(document["components"]["schemas"][name], document)


def response_schema(path: str, method: str = "get", status: str = "200",
                    media_type: str = "application/json") -> dict[str, Any]:
    """The schema of one published answer, as a JSON Schema."""
    document = reference_document()
    answer = document["paths"][path][method]["responses"][status]
    return _converted(answer["content"][media_type]["schema"], document)


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Every way `instance` fails `schema` (empty when it validates), each with its path."""
    validator = jsonschema.Draft4Validator(schema)
    return [f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in validator.iter_errors(instance)]


def with_spec_model_capabilities(listing: dict[str, Any]) -> dict[str, Any]:
    """The reference's `GET /models` answer with the two `capabilities` our spec names
    (Resources, "Model record": `capabilities.maxInputImages` and flags such as
    `supportsOptimizePromptThinking`). The reference's `capabilities` admits no keys beyond
    its own; where the two disagree the spec stands: exactly those two are added, typed as the
    reference types the same fields elsewhere."""
    model_spec = listing["properties"]["data"]["items"]["properties"]["model_spec"]
    capabilities = model_spec["properties"]["capabilities"]["properties"]
    capabilities["maxInputImages"] = {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
    capabilities["supportsOptimizePromptThinking"] = {"type": "boolean"}
    return listing
