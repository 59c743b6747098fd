"""Importing a user's Python file (a graph file, a worker file) so that its code can
also run in other processes.

A user's file is imported under a private module name that no other process can
import, and the files it imports from beside it (a helper module in the same folder)
are on no worker's `sys.path`. Both are therefore registered with cloudpickle to be
pickled *by value*: Ray workers receive the functions and classes themselves, not a
module name to import. Both cloudpickles are told: Ray's vendored copy (what Ray and
`ShippedNode` use; told when a Ray session starts) and the standalone package
when it is installed.

State: `sys.modules` gains the user's module and its helpers; `sys.meta_path` gains
a last-resort finder per user folder (`_BesideFinder`), so the file's own imports of
files beside it work on the driver without putting the folder on `sys.path` (where
a `random.py` beside the graph would shadow the standard module). `_BY_VALUE` lists
the modules to ship by value.
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["exec_user_file", "import_user_file", "user_module_name", "modules_beside",
           "pickle_by_value", "register_with_ray"]

_BY_VALUE: dict[str, ModuleType] = {}  # user modules to ship by value, by name


def user_module_name(path: str) -> str:
    """The private module name of the user's file at `path` (one per absolute path)."""
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    return f"hybridflow_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:10]}"


def import_user_file(path: str, what: str, error: type[Exception] = ValueError) -> ModuleType:
    """The one way a user's Python file (a graph, worker, scorer or environment file) is
    imported: it must be a regular .py file (a directory or a FIFO is named as one), and
    a failing import raises `error` naming the file."""
    from hybridflow.core.loading import UserFileError, check_file
    try:
        check_file(path, what, "give the path of a Python file", empty_ok=True)
    except UserFileError as err:
        raise error(str(err)) from None
    return exec_user_file(path, user_module_name(path), error, what)


def exec_user_file(path: str, name: str, error: type[Exception], what: str) -> ModuleType:
    """Import the file at `path` as module `name` (once); the modules it imports from
    its own folder are shipped by value along with it. A failing import raises
    `error` naming the file."""
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(os.path.abspath(path))
    _find_beside(folder)
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a .py name: no loader knows it
        raise error(f"{what} {path!r} is not a Python source file (.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # sys.exit too: never leave a half-imported module cached
        del sys.modules[name]
        if not isinstance(err, Exception):
            raise
        detail = " ".join(str(err).split())
        raise error(f"{what} {path!r} failed to import: {type(err).__name__}: {detail}") from err
    pickle_by_value(module)
    for helper in modules_beside(folder, set(sys.modules) - before - {name}):
        pickle_by_value(helper)
    return module


class _BesideFinder(importlib.abc.MetaPathFinder):
    """Finds `import name` as `<folder>/name.py` (or a package `<folder>/name/`), as a
    last resort: after every other finder, so a file beside the graph never shadows
    an installed or standard module, and `sys.path` is left as it is."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:  # submodules: their package's own path
            return None
        for candidate in (os.path.join(self.folder, name, "__init__.py"),
                          os.path.join(self.folder, f"{name}.py")):
            if os.path.isfile(candidate):
                locations = [os.path.dirname(candidate)] if candidate.endswith(
                    "__init__.py") else None
                return importlib.util.spec_from_file_location(
                    name, candidate, submodule_search_locations=locations)
        return None


def _find_beside(folder: str) -> None:
    if not any(isinstance(f, _BesideFinder) and f.folder == folder for f in sys.meta_path):
        sys.meta_path.append(_BesideFinder(folder))


def modules_beside(folder: str, names: set[str]) -> list[ModuleType]:
    """The modules among `names` whose source lies in `folder` or below it, except
    those a worker can import by name anyway (inside site-packages, or this project's
    own packages)."""
    folder = os.path.realpath(folder) + os.sep
    found = []
    for name in sorted(names):
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None)
        if not source or "site-packages" in source:
            continue
        if os.path.realpath(source).startswith(folder) and not _project_module(module):
            found.append(module)
    return found


def _project_module(module: ModuleType) -> bool:
    """hybridflow and its shipped library (graphs/, algorithms/, under any of their
    names) are importable wherever hybridflow is; a user's own package called `graphs`
    is not."""
    from hybridflow.core.shipped import is_shipped
    return module.__name__.split(".")[0] == "hybridflow" or is_shipped(module)


def pickle_by_value(module: ModuleType) -> None:
    """Make cloudpickle pickle `module`'s functions and classes by value: the
    standalone package now, Ray's copy now if Ray is loaded, else when a Ray
    session starts (`register_with_ray`; importing Ray costs a local run a second)."""
    _BY_VALUE[module.__name__] = module
    try:
        import cloudpickle
        cloudpickle.register_pickle_by_value(module)
    except ImportError:
        pass
    if "ray" in sys.modules:
        register_with_ray()


def register_with_ray() -> None:
    """Register every user module seen so far with Ray's cloudpickle (idempotent)."""
    from ray import cloudpickle as ray_cloudpickle
    for name, module in _BY_VALUE.items():
        if sys.modules.get(name) is module:
            ray_cloudpickle.register_pickle_by_value(module)
