"""Imports point one way: no circle among the modules of runner/ and recipes/, counting every
import statement (inside functions too, and ``importlib.import_module("...")`` with a literal
name) and counting a package's ``__init__`` as a module of its own. Imports under
``if TYPE_CHECKING:`` are left out: they never run (a module of the trainer's package names
the Trainer's type that way)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("runner", "recipes")


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The nodes inside ``if TYPE_CHECKING:`` blocks."""
    return {inner for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for statement in node.body for inner in ast.walk(statement)}


def imported_names(module: str, is_init: bool, tree: ast.AST) -> set[str]:
    names = set()
    skipped = type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_init else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for module, (path, is_init) in known.items():
        targets = set()
        for name in imported_names(module, is_init, ast.parse(path.read_text())):
            while name and name not in known:  # a name inside a module: that module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and "runner.trainer" in graph
    assert circles(graph) == []


def test_the_walker_finds_a_circle():
    """The check itself: a deferred import back into a package is a circle."""
    graph = {"a": {"a.b"}, "a.b": {"c"}, "c": set()}
    assert circles(graph) == []
    graph["c"] = {"a"}  # e.g. ``def f(): from a import x`` inside c
    assert circles(graph) == [["a", "a.b", "c"]]


def test_schemas_and_registries_are_leaves():
    """runner/config/section.py and each registry module import nothing of the project's
    parts; the recipe interface and its registry stand on them alone."""
    graph = import_graph()
    assert graph["runner.config.section"] <= {"runner.errors"}
    assert graph["runner.config.registry"] <= {"runner.errors"}
    assert graph["runner.lazy"] == set()
    for registry in ("runner.algos.registry", "runner.topology.registry",
                     "runner.launch.registry", "runner.sim.registry"):
        assert graph[registry] <= {"runner.config.registry",
                                   registry.rpartition(".")[0] + ".base"}
    assert graph["runner.recipe"] <= {"runner.config.registry", "runner.config.section",
                                      "runner.lazy"}
    # Only the commands, and the composition they share, validate against the registries.
    users = sorted(m for m, targets in graph.items()
                   if {"runner.algos", "runner.recipe", "runner.launch"} <= targets)
    assert users and all(m.startswith("runner.commands.") for m in users), users


# The floors of the house, top to bottom: a module imports only its own floor and those below
# (a package's modules by their longest prefix here). CLI -> launcher -> a rank's worker ->
# the trainer -> elastic training, entered from the trainer -> the simulator, which drives
# the same parts as the trainer -> checkpoints -> the training
# loop's parts -> algorithms -> what a run records -> topology, communication -> recipes ->
# config, registries and errors.
FLOORS = [("runner.commands",), ("runner.launch",), ("runner.worker", "runner.rank"),
          ("runner.trainer",), ("runner.elastic",), ("runner.sim",), ("runner.checkpoint",),
          ("runner.train",), ("runner.algos",), ("runner.runlog",), ("runner.topology",),
          ("runner.comm",),
          ("recipes",),
          ("runner", "runner.config", "runner.recipe", "runner.errors", "runner.lazy",
           "runner.ctrl_c")]


def floor_of(module: str) -> int:
    """The index in FLOORS of the longest prefix that names ``module``."""
    matches = [(len(prefix), floor) for floor, prefixes in enumerate(FLOORS)
               for prefix in prefixes if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} stands on no floor: add its package to FLOORS"
    return max(matches)[1]


def imports_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower floor to a higher one, as ``importer -> imported``."""
    return [f"{module} -> {target}" for module, targets in sorted(graph.items())
            for target in sorted(targets) if floor_of(module) > floor_of(target)]


def test_no_import_runs_up_the_floors():
    """Nothing imports a floor above it: e.g. the worker nothing of the launcher's side (a
    rank's heartbeat and exit record are runner/runlog/liveness.py's), the config nothing of
    the simulator (the cluster's schema is runner/config/cluster.py), the algorithms nothing
    of the training loop (timers and the flat SGD sit below them), what a run records
    nothing of checkpoints (the launcher's failure summary lists them)."""
    assert imports_up(import_graph()) == []


def test_nothing_below_the_elastic_package_imports_it():
    """Elastic training is one layer over the trainer's parts: only the trainer and the
    worker (a rank's start: spares split off, the launcher's link) enter it; the trainer's
    regrouping needs nothing of it (the shards deal themselves again)."""
    graph = import_graph()
    users = {module for module, targets in graph.items() if not module.startswith(
        "runner.elastic") and any(t.startswith("runner.elastic") for t in targets)}
    assert users == {"runner.trainer.loop", "runner.trainer.meetings", "runner.rank"}, users


def test_the_floors_rule_catches_an_import_up():
    """The check itself: the worker importing the launcher's watchdog, and the topology
    importing the algorithms, are found."""
    graph = import_graph()
    graph["runner.rank"] = graph["runner.rank"] | {"runner.launch.watchdog"}
    graph["runner.topology.base"] = graph["runner.topology.base"] | {"runner.algos"}
    assert imports_up(graph) == ["runner.rank -> runner.launch.watchdog",
                                 "runner.topology.base -> runner.algos"]


# The runner's modules that may import the recipes package: it registers the recipes in
# runner/recipe.py's RECIPES, which the commands and a rank (runner/rank.py) fill.
RECIPE_IMPORTERS = ("runner.commands.", "runner.rank")


def recipe_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Runner modules that import the recipes package (or a module of it), other than the
    commands and the worker."""
    return {module: hits for module, targets in graph.items()
            if module.startswith("runner") and not module.startswith(RECIPE_IMPORTERS)
            and (hits := {t for t in targets if t == "recipes" or t.startswith("recipes.")})}


def test_the_runner_stands_below_the_recipes():
    """Recipes import the runner; the runner imports no recipe except where the commands and
    the worker fill the registry."""
    graph = import_graph()
    assert recipe_imports(graph) == {}
    assert any("recipes" in graph[m] for m in graph if m.startswith("runner.commands."))
    assert "recipes" in graph["runner.rank"]
    for recipe in ("recipes.digit_images", "recipes.imagenet.recipe", "recipes.speech.recipe"):
        assert "runner.recipe" in graph[recipe], recipe


def test_the_rule_catches_a_recipe_import_in_the_loop():
    """The check itself: the trainer importing the recipes package again is found."""
    graph = import_graph()
    graph["runner.trainer"] = graph["runner.trainer"] | {"recipes"}
    graph["runner.sim.engine"] = graph["runner.sim.engine"] | {"recipes.speech.model"}
    assert recipe_imports(graph) == {"runner.trainer": {"recipes"},
                                     "runner.sim.engine": {"recipes.speech.model"}}


# Run in a fresh interpreter: check every algorithm's and recipe's config the way adpsgd-run
# does before a job, then run a real 2-rank job through adpsgd-run's main(), and report the
# first import of torch (or its family) in this process, with where it came from.
LAUNCHER_WITHOUT_TORCH = """
import json, sys, traceback
HEAVY = ("torch", "torchvision", "torchaudio", "tensorboard")
first = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if not first and name.partition(".")[0] in HEAVY:
            first.append(name + "\\n" + "".join(traceback.format_stack(limit=12)))
sys.meta_path.insert(0, Spy())
from runner.algos import ALGORITHMS
from runner.commands.run import main, preflight
from runner.errors import UserError
from runner.recipe import RECIPES
checked = []
pairs = ([(recipe, "ssgd") for recipe in RECIPES.names()]
         + [("digit_images", algo) for algo in ALGORITHMS.names()])
for recipe, algo in pairs:
    try:
        preflight([f"recipe={recipe}", f"algo={algo}", "launcher.nprocs=4"])
    except UserError:  # data not prepared here, a size the algorithm refuses: checked
        pass
    checked.append(f"{recipe}/{algo}")
sys.argv = ["adpsgd-run", *sys.argv[1:]]
try:
    main()
finally:
    print(json.dumps({"checked": checked, "first_heavy_import": first[:1]}))
"""


@pytest.mark.slow
@pytest.mark.mpi
def test_the_launcher_never_imports_torch(tmp_path):
    """adpsgd-run checks every algorithm and recipe and starts the ranks without importing
    torch (3 to 4 s of CPU per command: runner/lazy.py); only the ranks do."""
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER_WITHOUT_TORCH, "recipe=digit_images", "algo=dpsgd",
         "launcher.nprocs=2", "trainer.epochs=1", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["checked"]) >= 5 + 9, report["checked"]
    assert report["first_heavy_import"] == [], report["first_heavy_import"][0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
