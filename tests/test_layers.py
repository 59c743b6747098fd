"""The package's layering, enforced: each folder of hybridflow/ imports only the folders
its `__init__.py` docstring allows, lazy imports inside functions and imports for type
checking included, so that no arrow runs back up and no two folders form a cycle.
docs/architecture.md draws the same layers."""
from __future__ import annotations

import ast
import glob
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "hybridflow")
EVERYTHING = {"core", "graph", "plan", "workers", "agents", "planner", "memory", "runtime",
              "draw", "program", "run", "commands"}
# What each folder may import besides itself, bottom up. A subfolder (runtime/ray,
# workers/rollout) is its folder's.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "planner": {"core"},  # the placement search works on its own problem types
    "graph": {"core"},
    "plan": {"core", "graph"},
    "workers": {"core", "graph"},
    # the agent role plays episodes with the actor's rollout engine and tokenizer
    "agents": {"core", "graph", "workers"},
    "runtime": {"core", "graph", "plan"},
    # memory is predicted from the real model classes, the planner's device table and,
    # for an agent rollout, the agent section's response budget
    "memory": {"core", "graph", "plan", "workers", "agents", "planner"},
    "draw": {"core", "plan"},
    "program": {"core", "graph", "plan", "workers", "agents", "planner", "memory"},
    "run": EVERYTHING - {"run", "commands"},
    "commands": EVERYTHING - {"commands"},
}


def module_name(path: str) -> str:
    """hybridflow/runtime/ray/pools.py -> hybridflow.runtime.ray.pools."""
    rel = os.path.relpath(path, REPO)[:-len(".py")].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every import anywhere in a file: top level, inside
    functions, under `if TYPE_CHECKING`; relative imports resolved against `module`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:len(module.split(".")) - node.level + is_package]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if node.module:
                found.append((node.lineno, name))
            else:
                found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return found


def folder_of(module: str) -> str | None:
    """The package folder a module lies in; None for the root modules (cli, __init__)."""
    parts = module.split(".")
    if len(parts) > 1 and os.path.isdir(os.path.join(PACKAGE, parts[1])):
        return parts[1]
    return None


def arrows() -> list[tuple[str, str, str]]:
    """(importing folder, imported folder, 'file:line module') across folders."""
    found = []
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
        module = module_name(path)
        source_folder = folder_of(module)
        if source_folder is None:
            continue  # hybridflow/__init__.py, cli.py, __main__.py stand above every folder
        with open(path, encoding="utf-8") as handle:
            imports = imported_modules(handle.read(), module, path.endswith("__init__.py"))
        for line, name in imports:
            if name != "hybridflow" and not name.startswith("hybridflow."):
                continue
            target = folder_of(name)
            where = f"{os.path.relpath(path, REPO)}:{line} imports {name}"
            if target is None:
                found.append((source_folder, "hybridflow (the root)", where))
            elif target != source_folder:
                found.append((source_folder, target, where))
    return found


def test_every_folder_of_the_package_has_a_rule():
    folders = {name for name in os.listdir(PACKAGE)
               if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))}
    assert folders == set(MAY_IMPORT), "give the new folder its line in MAY_IMPORT (and say "\
        "in its __init__.py what it may import)"


def test_no_folder_imports_one_above_it():
    wrong = [where for source, target, where in arrows()
             if target not in MAY_IMPORT[source]]
    assert not wrong, ("imports that run against the layers (tests/test_layers.py "
                       "MAY_IMPORT; each folder's __init__.py says why): "
                       + "; ".join(wrong))


def test_the_rules_themselves_have_no_cycle():
    done: set[str] = set()

    def visit(folder: str, path: tuple[str, ...]) -> None:
        assert folder not in path, f"the layers form a cycle: {' -> '.join(path + (folder,))}"
        if folder not in done:
            for below in MAY_IMPORT[folder]:
                visit(below, path + (folder,))
            done.add(folder)
    for folder in MAY_IMPORT:
        visit(folder, ())


@pytest.mark.parametrize("source,module,package,expected", [
    ("from hybridflow.core import batch", "hybridflow.plan.compiler", False,
     ["hybridflow.core"]),
    ("def f():\n    import hybridflow.run.loop\n", "hybridflow.plan.x", False,
     ["hybridflow.run.loop"]),
    ("from ..core.batch import Batch", "hybridflow.plan.compiler", False,
     ["hybridflow.core.batch"]),
    ("from . import pools", "hybridflow.runtime.ray", True, ["hybridflow.runtime.ray.pools"]),
    ("from .. import common", "hybridflow.runtime.ray.pools", False,
     ["hybridflow.runtime.common"]),
    ("if TYPE_CHECKING:\n    from hybridflow.program import config\n", "hybridflow.run.x",
     False, ["hybridflow.program"]),
])
def test_the_scan_sees_lazy_relative_and_typing_imports(source, module, package, expected):
    assert [name for _, name in imported_modules(source, module, package)] == expected
