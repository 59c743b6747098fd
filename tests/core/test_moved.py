"""Issue 36, item 9: every module path that was ever in the project imports now.

`hybridflow/core/moved.py`'s MOVED (and SHADOWED) is the one list of old paths;
tests/core/test_public_surface.py imports each entry and checks its warning. This
file checks the list is complete against the repository's own history: every
Python module that any commit had under hybridflow/, algorithms/ or graphs/ either
exists now or is in the list, so the next move cannot forget its alias."""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from hybridflow.core.moved import MOVED, SHADOWED, MovedImportWarning

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module(path: str) -> str:
    name = path[:-len(".py")].replace("/", ".")
    return name.removesuffix(".__init__")


def _history_modules() -> set[str]:
    if shutil.which("git") is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout: the history is not here to compare with")
    listed = subprocess.run(
        ["git", "-C", REPO, "log", "--all", "--full-history", "--name-only", "--format=",
         "--", "hybridflow", "algorithms", "graphs"],
        capture_output=True, text=True, check=True).stdout.split()
    return {_module(p) for p in listed if p.endswith(".py")}


def _exists_now(module: str) -> bool:
    base = os.path.join(REPO, *module.split("."))
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def test_every_module_path_in_the_history_exists_or_has_an_alias():
    history = _history_modules()
    assert "hybridflow.constraints" in history and "algorithms.envs.calculator" in history
    forgotten = sorted(m for m in history
                       if not _exists_now(m) and m not in MOVED and m not in SHADOWED)
    assert not forgotten, ("these module paths were in the project once and import "
                           "nothing now; add each to MOVED in hybridflow/core/moved.py: "
                           + ", ".join(forgotten))


def test_every_alias_leads_to_a_module_that_exists():
    # found as the import system finds it (hybridflow.graphs is the repository's graphs/)
    missing = [new for new in MOVED.values() if importlib.util.find_spec(new) is None]
    assert not missing


def test_the_path_the_docs_taught_two_releases_ago_imports_with_a_warning():
    for name in [m for m in sys.modules if m.startswith("algorithms.envs")]:
        del sys.modules[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from algorithms.envs.calculator import make_env
        from algorithms.envs.calculator_sft import main  # noqa: F401
    import hybridflow.graphs.envs.calculator as now
    assert make_env is now.make_env  # the module itself, not a second copy of it
    said = [str(w.message) for w in caught if issubclass(w.category, MovedImportWarning)]
    assert any("graphs.envs.calculator" in s and "instead" in s for s in said), said


def test_a_moved_package_finds_its_submodules_only_through_the_list():
    module = importlib.import_module("algorithms.envs")
    assert module.__path__ == []  # the path finder would load a second copy of each
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("algorithms.envs.no_such_env")
