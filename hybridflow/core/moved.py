"""Old import paths keep working: every module path the history ever had under
hybridflow/, algorithms/ and graphs/ (the folder move, a68febe: `hybridflow.constraints`,
`hybridflow.loss`, ...; the later moves; `algorithms.envs.calculator`, the docs' path
two releases ago) imports the module that took its place, with a `MovedImportWarning` (a
DeprecationWarning shown by default) naming the import to write instead; a name that
is not there fails naming where it lives now.

User files (graph files, workers, losses, scorers, environments) should import from
`hybridflow` (the public surface, `hybridflow/__init__.py`), which does not move.
The finder is installed once, at the end of `sys.meta_path`, by `hybridflow/__init__.py`:
it is asked only about names no real module has. State: `_INDEX`, the names each
module of the package defines (read from the source on the first failed lookup).
"""
from __future__ import annotations

import ast
import dis
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

__all__ = ["MOVED", "MovedImportWarning", "install", "moved_name", "where_defined"]

# old module path -> the module that holds its names now: every module path under
# hybridflow/, algorithms/ and graphs/ in the history that is not there now (git log
# --name-only; tests/core/test_public_surface.py checks the list against git's)
MOVED = {f"hybridflow.{old}": f"hybridflow.{new}" for old, new in {
    "batch": "core.batch", "constraints": "core.constraints", "data": "core.data",
    "deadline": "core.deadline", "kinds": "core.kinds", "named": "core.names",
    "user_code": "core.user_code", "render": "draw.graph", "render_style": "draw.style",
    "render_timeline": "draw.timeline", "dispatch": "graph.dispatch", "loss": "graph.loss",
    "async_split": "plan.async_split", "balance": "plan.balance",
    "compiler": "plan.compiler", "placement": "plan.placement",
    "weight_sync": "plan.weight_sync", "async_planning": "program.async_planning",
    "auto_placement": "program.auto_placement", "config": "program.config",
    "preflight": "program.preflight", "provenance": "program.provenance",
    "planner.run_dir": "program.run_dir", "user_files": "program.user_files",
    "checkpoint": "run.checkpoint", "run_lifecycle": "run.lifecycle",
    "run_lock": "run.lock", "loop": "run.loop", "run_signals": "run.signals",
    "tracking": "run.tracking",
    "runtime.ray_pools": "runtime.ray.pools", "runtime.ray_session": "runtime.ray.session",
    "runtime.ray_tasks": "runtime.ray.tasks", "runtime.ray_worker": "runtime.worker_shell",
    "runtime.ray_outputs": "runtime.outputs", "runtime.ray_reshard": "runtime.reshard",
    "workers.rollout_hf": "workers.rollout.hf", "workers.rollout_vllm": "workers.rollout.vllm",
    # the parallel pieces of workers/, into one folder (issue 38)
    "workers.backends.tensor_parallel": "workers.parallel.tensor_parallel",
    **{f"workers.{m}": f"workers.parallel.{m}" for m in (
        "gather", "parallelize", "safe_dcp", "shard_build", "sharded_checkpoint",
        "vocab_parallel")},
    # the run-long scheduler's modules, into one folder (issue 31)
    **{f"runtime.{m}": f"runtime.run_long.{m}" for m in (
        "run_scheduler", "stream_buffer", "stream_client", "stream_entrance",
        "stream_record")},
    "runtime.streaming": "runtime.run_long.stream_source",
    **{f"runtime.{m}": f"runtime.run_long.{m}" for m in (
        "draws", "pass_source", "stream_source")},
    # modules merged from a branch into the layers (the realmodel merge, ffb52eb/941a888)
    "run_generations": "run.generations", "toy_defaults": "program.toy_defaults",
    # modules whose work another took over; a name that did not follow fails naming
    # where it is defined now (busy_fractions: run.busy)
    "async_loop": "runtime.run_long.run_scheduler",
    "run.async_loop": "runtime.run_long.run_scheduler",  # f234c28: the run scheduler
    "commands.common": "program.assemble",  # ab94955: the program layer
    "runtime.ray_step": "runtime.scheduler",  # ff9893c: one step scheduler
    "runtime.funnel": "runtime.scheduler",  # 5ba4b8c: the rank-0 funnel removed
}.items()}
# the shipped library's own moves: the calculator environments, algorithms/envs ->
# graphs/envs (a68febe), taught by the docs as `algorithms.envs.calculator`
MOVED.update({"algorithms.envs": "hybridflow.graphs.envs",
              "algorithms.envs.calculator": "hybridflow.graphs.envs.calculator",
              "algorithms.envs.calculator_sft": "hybridflow.graphs.envs.calculator_sft"})
# old modules whose path is a package now: their names, looked up by the package's
# __getattr__ (graph/__init__.py, program/__init__.py, runtime/ray/__init__.py)
SHADOWED = {"hybridflow.graph": "hybridflow.graph.builder",
            "hybridflow.program": "hybridflow.program.assemble",
            "hybridflow.runtime.ray": "hybridflow.runtime.ray.executor"}


class MovedImportWarning(DeprecationWarning):
    """An import through a path from before the folder move."""


def _public() -> set[str]:
    return set(getattr(sys.modules.get("hybridflow"), "__all__", ()))


def _advice(old: str, new: str, names=()) -> str:
    public = sorted(n for n in names if n in _public())
    use = f"from hybridflow import {', '.join(public)}" if public else f"import {new}"
    return (f"{old} moved to {new} (layer folders may move again): {use} instead; "
            f"see docs/functions.md for the public names")


def _warn(old: str, new: str, names=()) -> None:
    warnings.warn(_advice(old, new, names), MovedImportWarning, stacklevel=3)


_INDEX: dict[str, list[str]] | None = None


def where_defined(name: str) -> list[str]:
    """The modules of hybridflow that define `name` at their top level (read from the
    source, nothing imported)."""
    global _INDEX
    if _INDEX is None:
        _INDEX = {}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for folder, _, files in os.walk(root):
            for file in sorted(files):
                if file.endswith(".py"):
                    _index_file(os.path.join(folder, file), os.path.dirname(root))
    return _INDEX.get(name, [])


def _index_file(path: str, top: str) -> None:
    module = os.path.relpath(path, top)[:-3].replace(os.sep, ".").removesuffix(".__init__")
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return
    for node in tree.body:
        targets = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef,
                                                    ast.AsyncFunctionDef)) else
                   [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)])
        for name in targets:
            _INDEX.setdefault(name, []).append(module)


def _importing(depth: int) -> bool:
    """Whether the frame `depth` up is running an import statement (`from old import
    name`), which shows an ImportError's message; any other lookup (getattr with a
    default, hasattr, pickle's search of sys.modules) must get an AttributeError."""
    try:
        frame = sys._getframe(depth + 1)
        return dis.opname[frame.f_code.co_code[frame.f_lasti]] in ("IMPORT_FROM",
                                                                    "IMPORT_NAME")
    except (ValueError, IndexError, AttributeError):
        return False


def _missing(old: str, new: str, name: str, depth: int = 2) -> Exception:
    """ImportError naming where `name` lives now, for an import statement;
    AttributeError (with the same message) for any other lookup."""
    error = _moved_error(old, new, name)
    return error if _importing(depth) else AttributeError(str(error))


def _moved_error(old: str, new: str, name: str) -> ImportError:
    if name in _public():
        return ImportError(f"{old} has no {name!r} (it moved to {new}): "
                           f"from hybridflow import {name}")
    homes = [m for m in where_defined(name) if not m.endswith("__main__")]
    where = f"it is defined in {', '.join(homes)}" if homes else "no module defines it now"
    return ImportError(f"cannot import {name!r} from {old} (moved to {new}): {where}")


class _Alias(types.ModuleType):
    """The old module's name, forwarding every attribute to the module that replaced it."""

    def __init__(self, old: str, target: types.ModuleType):
        super().__init__(old, target.__doc__)
        self.__target = target
        self.__all__ = list(getattr(target, "__all__", ()))
        if hasattr(target, "__path__"):  # a package: its submodules are found by MOVED
            self.__path__ = []  # only (never by path, which would load a second copy)

    def __getattr__(self, name: str):
        target = self.__dict__["_Alias__target"]
        try:
            return getattr(target, name)
        except AttributeError:
            if name.startswith("__"):
                raise
            raise _missing(self.__name__, target.__name__, name) from None

    def __dir__(self):
        return dir(self.__dict__["_Alias__target"])


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        new = MOVED[spec.name]
        target = importlib.import_module(new)
        _warn(spec.name, new, getattr(target, "__all__", ()))
        return _Alias(spec.name, target)

    def exec_module(self, module) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, _Loader())
        return None


def moved_name(package: str, name: str):
    """For a package's `__getattr__`: a name of the old module that had the package's
    path (e.g. `from hybridflow.program import prepare`), with the warning; an
    AttributeError naming where it lives otherwise."""
    old = SHADOWED.get(package)
    if old is None or name.startswith("__"):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    target = importlib.import_module(old)
    if not hasattr(target, name):  # never a name at this path: a plain AttributeError
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(package, old, [name])
    return getattr(target, name)


def install() -> None:
    """Put the finder at the end of sys.meta_path (once), and show its warnings by
    default: a DeprecationWarning raised in a user's file is hidden otherwise."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
        warnings.filterwarnings("default", category=MovedImportWarning)
