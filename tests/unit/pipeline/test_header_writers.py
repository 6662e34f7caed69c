"""The answer's headers have one writer: the setters of serve_app/pipeline/respond.py. No other
module of the Gateway writes `<something>.headers[...]` or calls `<something>.headers.update`."""

import ast
from pathlib import Path

import serve_app

ROOT = Path(serve_app.__file__).parent
SETTERS = ROOT / "pipeline" / "respond.py"
WRITING_METHODS = {"update", "setdefault", "append", "__setitem__"}


def _is_headers(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "headers"


def _header_writes(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        lines += [t.lineno for t in targets
                  if isinstance(t, ast.Subscript) and _is_headers(t.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in WRITING_METHODS and _is_headers(node.func.value):
            lines.append(node.lineno)
    return lines


def test_only_the_setters_write_an_answers_headers():
    writers = {
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in ROOT.rglob("*.py") if path != SETTERS
        for line in _header_writes(ast.parse(path.read_text(), str(path)))
    }
    assert not writers, f"headers written outside pipeline/respond.py: {sorted(writers)}"


def test_the_guard_sees_a_raw_header_write():
    tree = ast.parse('ctx.headers["x-service-upscale-factor"] = "2"\n'
                     'response.headers.update({"PAYMENT-RESPONSE": "r"})\n')
    assert _header_writes(tree) == [1, 2]
