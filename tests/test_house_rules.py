"""The house's rules: size limits, which keep each module about one concern (no function of
runner/ over 80 lines, the local launcher runner/launch/local.py within 500 lines and the
training loop runner/trainer/loop.py within 350), and the seat that no one repoints."""

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


SEATED = ("world", "comm", "node_comm")


def repointed_seats(source: str) -> list[str]:
    """``line: target`` of each assignment of a world or communicator to another object's
    attribute (``t.checkpointer.comm = ...``): a part repointed from outside, which is what
    runner/comm/seat.py replaces."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(leaf, ast.Attribute) and leaf.attr in SEATED and not (
                        isinstance(leaf.value, ast.Name) and leaf.value.id == "self"):
                    found.append(f"{node.lineno}: {ast.unparse(leaf)}")
    return found


def test_no_part_of_a_trainer_is_repointed_at_a_new_world():
    """What talks to the other learners reads the world and its communicators from the
    trainer's Seat, so a regroup moves the seat and nothing else: no module assigns a world or
    a communicator to another object's attribute."""
    found = {str(path.relative_to(REPO)): hits for path in sorted((REPO / "runner").rglob("*.py"))
             if (hits := repointed_seats(path.read_text()))}
    assert found == {}


def test_the_rule_finds_a_repointed_part():
    assert repointed_seats("t.world, t.comm = world, comm\nt.ctx.node_comm = c\n") == [
        "1: t.world", "1: t.comm", "2: t.ctx.node_comm"]
    assert repointed_seats("self.comm = comm\nworld = 1\n") == []
