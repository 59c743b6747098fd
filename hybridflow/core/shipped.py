"""The shipped library's public names: `hybridflow.graphs` (the graph files and the ops
they share) and `hybridflow.algorithms` (the RL math, plain torch functions).

The repository keeps them as top-level folders, graphs/ and algorithms/; an install
puts them under hybridflow's own name (setup.py maps the folders), so a user's own
`graphs/` or `algorithms/` folder never collides with them. One module object per
file, whichever name imported it, so functions compare equal by identity and nothing
registers twice:

- `hybridflow.graphs[.x]` in a checkout (no hybridflow/graphs folder): loaded from
  the repository's graphs/ under the public name;
- `graphs[.x]`, `algorithms[.x]` (the names the docs taught until this release) import
  the public module itself: silently when the top-level folder is the repository's
  own on `sys.path` (a checkout: the repository's tests), with a `MovedImportWarning`
  naming the import to write when nothing else is called that (an install);
- a top-level `graphs`/`algorithms` that is not the shipped folder (a user's own
  package) is theirs: never aliased, and it wins over the old names.

State: the finder, first on `sys.meta_path` (installed by `hybridflow/__init__.py`,
asked about every import and answering only these names); `_WARN`, per old top-level
name, whether importing it warns (decided when it is first imported).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings
from types import ModuleType

__all__ = ["SHIPPED", "adopt", "install", "is_shipped", "shipped_folder"]

SHIPPED = ("graphs", "algorithms")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hybridflow/
_WARN: dict[str, bool] = {}


def shipped_folder(top: str) -> str | None:
    """The folder of `top` ("graphs"): hybridflow/graphs in an install, the checkout's
    top-level graphs/ beside hybridflow/ otherwise."""
    for folder in (os.path.join(_PACKAGE, top), os.path.join(os.path.dirname(_PACKAGE), top)):
        if os.path.isfile(os.path.join(folder, "__init__.py")):
            return os.path.realpath(folder)
    return None


def _inside(path: str | None, top: str) -> bool:
    folder = shipped_folder(top)
    return bool(path and folder) and os.path.realpath(path).startswith(folder + os.sep)


def is_shipped(module: ModuleType | None) -> bool:
    """Whether `module` is a file of the shipped library (under any of its names)."""
    path = getattr(module, "__file__", None)
    return any(_inside(path, top) for top in SHIPPED)


def _split(name: str) -> tuple[str, str, bool] | None:
    """(top, rest, public) of a name of the shipped library: "hybridflow.graphs.ops" ->
    ("graphs", ".ops", True), "graphs.ops" -> ("graphs", ".ops", False); None otherwise."""
    public = name.startswith("hybridflow.")
    bare = name[len("hybridflow."):] if public else name
    top, dot, rest = bare.partition(".")
    return (top, dot + rest, public) if top in SHIPPED else None


def _warning(old: str, new: str) -> str:
    return (f"{old} is {new} now (the shipped library installs under hybridflow's name, so "
            f"a folder of your own called {old.partition('.')[0]}/ is yours): import {new} "
            f"instead; see docs/functions.md for the public names")


def _caller_level() -> int:
    """The stack level of the frame that ran the import statement: past this module's
    and importlib's frames (its _bootstrap frames, which `warnings` itself skips, are
    not counted)."""
    machinery = (os.path.dirname(importlib.__file__) + os.sep, __file__)
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name
        if not internal and not name.startswith(machinery):
            return level
        frame, level = frame.f_back, level + (not internal)
    return 1


class _SameModule(importlib.abc.Loader):
    """Loads an old name as the public module itself: the placeholder module the import
    system makes is replaced in `sys.modules`, which the import then returns."""

    def __init__(self, public: str, warn: bool):
        self.public, self.warn = public, warn

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        target = importlib.import_module(self.public)
        self._warn(module.__name__)
        sys.modules[module.__name__] = target

    def get_code(self, fullname: str):
        """`python -m graphs.envs.calculator_sft` (runpy): the public module's code."""
        self._warn(fullname)
        return importlib.util.find_spec(self.public).loader.get_code(self.public)

    def _warn(self, old: str) -> None:
        if self.warn:
            from hybridflow.core.moved import MovedImportWarning
            warnings.warn(_warning(old, self.public), MovedImportWarning,
                          stacklevel=_caller_level())


class _Twin(importlib.abc.Loader):
    """An already-loaded module of the shipped library, under its other name."""

    def __init__(self, target: ModuleType):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = self.target


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(("graphs", "algorithms", "hybridflow.graphs",
                                    "hybridflow.algorithms")):
            return None
        parts = _split(fullname)
        if parts is None:
            return None
        top, rest, public = parts
        if not public:
            return self._old_name_spec(fullname, top, rest)
        twin = sys.modules.get(top + rest)
        if is_shipped(twin):  # loaded under its old name first (a checkout's tests)
            return importlib.util.spec_from_loader(fullname, _Twin(twin))
        return None if rest else self._checkout_spec(fullname, top)

    @staticmethod
    def _checkout_spec(fullname: str, top: str):
        """`hybridflow.graphs` in a checkout: the repository's graphs/ (an install has
        hybridflow/graphs, which the path finder finds)."""
        folder = shipped_folder(top)
        if folder is None or folder == os.path.realpath(os.path.join(_PACKAGE, top)):
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])

    def _old_name_spec(self, fullname: str, top: str, rest: str):
        from hybridflow.core.moved import MOVED
        if fullname in MOVED:  # the old names' own moves (algorithms.envs): moved.py's
            return None
        if rest:
            parent = sys.modules.get(fullname.rpartition(".")[0])
            public = self._spec(f"hybridflow.{fullname}") if is_shipped(parent) else None
            if public is None:
                return None  # a user's own package, or no such module
            return importlib.util.spec_from_loader(  # origin: runpy's sys.argv[0]
                fullname, _SameModule(public.name, _WARN.get(top, False)),
                origin=public.origin)
        found = self._elsewhere(top)
        if found is not None and not _inside(found.origin, top):
            return None  # a package of the user's called `graphs`: theirs
        _WARN[top] = found is None  # a checkout's own folder on sys.path: no warning
        return importlib.util.spec_from_loader(fullname, _SameModule(f"hybridflow.{top}",
                                                                     _WARN[top]))

    def _elsewhere(self, top: str):
        """What the other finders would import as `top` (None: nothing)."""
        from hybridflow.core.moved import _Finder as Moved
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, Moved) or not hasattr(finder,
                                                                          "find_spec"):
                continue
            spec = finder.find_spec(top, None)
            if spec is not None:
                return spec
        return None

    @staticmethod
    def _spec(name: str):
        try:
            return importlib.util.find_spec(name)
        except ImportError:
            return None


def adopt(name: str) -> None:
    """For graphs/__init__.py and algorithms/__init__.py run under their old top-level
    name (imported before hybridflow, so before the finder): that name becomes the
    public package itself, whose modules then all load under the public names."""
    del sys.modules[name]  # the half-run old one: not a twin for the public name to take
    sys.modules[name] = importlib.import_module(f"hybridflow.{name}")


def install() -> None:
    """Put the finder first on sys.meta_path (once): before the path finder, which would
    load a second copy of a shipped file under its old name."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
