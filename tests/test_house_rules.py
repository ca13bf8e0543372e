"""The house's size limits, which keep each module about one concern: no function of runner/
over 80 lines, the local launcher (runner/launch/local.py) within 500 lines and the training
loop (runner/trainer/loop.py) within 350."""

from __future__ import annotations

import ast

from conftest import REPO

FUNCTION_LINES = 80
MODULE_LINES = {"runner/launch/local.py": 500, "runner/trainer/loop.py": 350}


def long_functions(source: str, limit: int) -> list[str]:
    """``name (N lines)`` of each function of ``source`` longer than ``limit`` lines (its
    signature, docstring and body)."""
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_of_the_runner_is_over_80_lines():
    found = {str(path.relative_to(REPO)): hits for path in sorted((REPO / "runner").rglob("*.py"))
             if (hits := long_functions(path.read_text(), FUNCTION_LINES))}
    assert found == {}


def test_the_rule_finds_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}", FUNCTION_LINES) == [
        f"f ({FUNCTION_LINES + 1} lines)"]
    assert long_functions("def g():\n    return 1\n", FUNCTION_LINES) == []


def test_the_launcher_and_the_loop_stay_within_their_sizes():
    sizes = {path: len((REPO / path).read_text().splitlines()) for path in MODULE_LINES}
    assert {path: n for path, n in sizes.items() if n > MODULE_LINES[path]} == {}, sizes
