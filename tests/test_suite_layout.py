"""The test suite's own rules: no test module imports another (shared code lives in
tests/support/ or a conftest.py), so each test file runs, and fails, on its own."""
from __future__ import annotations

import ast
import glob
import os

from tests.support.costs import SLOW_ELSEWHERE, is_listed

TESTS = os.path.dirname(os.path.abspath(__file__))
# Offenders being fixed by their owners. Remove an entry when it is fixed; the list
# may only shrink.
KNOWN: dict[str, list[str]] = {}


def is_test_module(name: str) -> bool:
    """`tests.e2e.test_determinism`, `test_determinism`, `.test_x`: any part named test_*."""
    return any(part.startswith("test_") for part in name.split("."))


def imported_test_modules(source: str) -> list[str]:
    """The test modules a file's source imports (dotted names as written)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names = [f"{base}.{a.name}" if node.module else base + a.name for a in node.names]
            found += [n for n in ([base] if node.module else names) if is_test_module(n)]
    return found


def offenders() -> dict[str, list[str]]:
    """Every file under tests/ that imports a test module -> what it imports."""
    found = {}
    for path in glob.glob(os.path.join(TESTS, "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            imports = imported_test_modules(handle.read())
        if imports:
            found[os.path.relpath(path, TESTS)] = imports
    return found


def test_no_test_module_imports_another():
    new = {path: imports for path, imports in offenders().items() if KNOWN.get(path) != imports}
    assert not new, (f"test modules imported from other files: {new}; move what they share "
                     "to tests/support/ or a conftest.py fixture")


def test_known_offenders_are_still_offending():
    fixed = set(KNOWN) - set(offenders())
    assert not fixed, f"{sorted(fixed)} no longer import a test module: remove them from KNOWN"


def test_the_check_sees_every_form_of_import():
    source = ("import test_a\nimport tests.e2e.test_b as b\nfrom tests.e2e.test_c import X\n"
              "from . import test_d\nfrom .test_e import Y\n"
              "from tests.support.e2e import train\nimport runtime_fakes\n")
    assert imported_test_modules(source) == ["test_a", "tests.e2e.test_b", "tests.e2e.test_c",
                                             ".test_d", ".test_e"]


def test_every_slow_entry_of_the_conftest_names_a_test():
    root = os.path.dirname(TESTS)
    for entry in SLOW_ELSEWHERE:
        path, _, name = entry.partition("::")
        assert os.path.isfile(os.path.join(root, path)), f"tests/support/costs.py: {path} is gone"
        if name:
            with open(os.path.join(root, path), encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name.split("[")[0] in tests, f"tests/support/costs.py: {entry} is gone"


def test_a_slow_entry_covers_its_file_or_its_test_and_nothing_with_a_longer_name():
    assert is_listed("tests/runtime/test_ray.py::test_a[dp]", "tests/runtime/test_ray.py")
    assert not is_listed("tests/runtime/test_ray_failures.py::test_a", "tests/runtime/test_ray.py")
    entry = "tests/workers/test_reward.py::test_timeout"
    assert is_listed("tests/workers/test_reward.py::test_timeout[1]", entry)
    assert not is_listed("tests/workers/test_reward.py::test_timeout_twice", entry)


def test_test_module_names_are_unique():
    """pytest imports test files by basename (no packages under tests/): two files with
    one name make the second fail to collect, and the whole run with it."""
    seen: dict[str, str] = {}
    clashes = []
    for path in sorted(glob.glob(os.path.join(TESTS, "**", "test_*.py"), recursive=True)):
        name = os.path.basename(path)
        if name in seen:
            clashes.append(f"{os.path.relpath(seen[name], TESTS)} and "
                           f"{os.path.relpath(path, TESTS)}")
        seen.setdefault(name, path)
    assert not clashes, f"test files share a name: {clashes}"
