"""The test suite's own rules: no test module imports another (shared code lives in
tests/support/ or a conftest.py), so each test file runs, and fails, on its own; the
tests' folders mirror the package's; a test is slow by its own mark; Ray's temp folder
is the test process's own."""
from __future__ import annotations

import ast
import glob
import os

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


# Folders of tests that test no one package folder: whole runs, benches, the RL math,
# the graph files, and what tests share.
NOT_A_PACKAGE_FOLDER = {"e2e", "bench", "algorithms", "graphs", "support"}


def test_the_test_folders_mirror_the_package():
    """tests/core tests hybridflow/core, and so on down: a test of a module is found
    where the module is."""
    package = os.path.join(os.path.dirname(TESTS), "hybridflow")
    stray = []
    for path in sorted(glob.glob(os.path.join(TESTS, "**", "test_*.py"), recursive=True)):
        folder = os.path.relpath(os.path.dirname(path), TESTS)
        if folder == ".":
            continue
        top = folder.split(os.sep)[0]
        if top not in NOT_A_PACKAGE_FOLDER and not os.path.isdir(os.path.join(package, folder)):
            stray.append(os.path.relpath(path, TESTS))
    assert not stray, (f"{stray}: no hybridflow/ folder of that name; put the test beside "
                       f"the package folder it tests, or in one of {sorted(NOT_A_PACKAGE_FOLDER)}")


def test_only_the_suite_rules_live_at_the_top_of_tests():
    """The rules over the whole package: its layers, the files its text names, the one
    owner of a role's layout, the one place the config's modes are converted, and the
    suite's own layout."""
    top = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TESTS, "test_*.py")))
    assert top == ["test_layers.py", "test_layout_owner.py", "test_mode_conversions.py",
                   "test_named_files.py", "test_suite_layout.py"], top


def test_no_conftest_marks_tests_slow_by_name():
    """One way to mark a test slow: `@pytest.mark.slow` or `pytestmark` in its file, where
    the reader sees it, not a list of node ids in a hook."""
    for path in glob.glob(os.path.join(TESTS, "**", "conftest.py"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        assert "pytest_collection_modifyitems" not in source, os.path.relpath(path, TESTS)


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


def test_ray_gets_a_temp_folder_of_this_test_process():
    """tests/conftest.py: the cluster address file that `ray.init()` joins lies in a
    folder of this process alone (an xdist worker or the serial run), so a
    `ray.cluster_utils.Cluster` started by another process is never joined."""
    from ray._common.utils import get_ray_address_file
    folder = os.environ["RAY_TMPDIR"]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert os.path.basename(folder).startswith(f"hf-ray-{worker}-") and os.path.isdir(folder)
    assert get_ray_address_file(None).startswith(folder + os.sep)
