"""Loading the user's own code: the graph file named on the command line and the
worker classes named in `workers.<role>`, and calling the graph file's functions
so that their errors name the file and line. Nothing else is ever imported from a
path the user did not name.

State: each file is imported once, under a private module name kept in
`sys.modules` (its functions, and those of the files beside it that it imports,
are pickled by value for Ray workers: see core/user_code.py).
"""
from __future__ import annotations

import os
import sys
from types import ModuleType

from hybridflow.core.constraints import ConfigError
from hybridflow.core.names import resolve_name
from hybridflow.core.user_code import import_user_file, register_with_ray

__all__ = ["GraphFileError", "load_graph_module", "import_object", "call_graph_file",
           "pickle_user_files_by_value_for_ray"]


class GraphFileError(ValueError):
    """The graph file is missing, does not import, or does not export build(cfg)."""


def load_graph_module(path: str) -> ModuleType:
    """The graph file's module; GraphFileError naming the file (a missing one, a
    directory or a FIFO in its place, a failing import, no build(cfg))."""
    module = import_user_file(path, "graph file", GraphFileError)
    if not callable(getattr(module, "build", None)):
        del sys.modules[module.__name__]
        raise GraphFileError(f"graph file {path!r} must export build(cfg) -> Graph")
    return module


def pickle_user_files_by_value_for_ray() -> None:
    """Register every user file (and the files beside it that it imported) with Ray's
    own cloudpickle; imports Ray, so only runs that use it call this."""
    register_with_ray()


def import_object(spec: str, key: str = "workers"):
    """'package.module:Name' or 'path/to/file.py:Name' (core/names.py's resolver)."""
    return resolve_name(spec, key, ConfigError, "a worker class", "worker file")


def call_graph_file(path: str, what: str, fn, *args):
    """Call the graph file's defaults() or build(cfg); its own errors name the file:line."""
    try:
        return fn(*args)
    except (ConfigError, GraphFileError):
        raise
    except Exception as err:
        target, line = os.path.abspath(path), None
        tb = err.__traceback__
        while tb is not None:  # the innermost frame in the user's file
            if os.path.abspath(tb.tb_frame.f_code.co_filename) == target:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f" at {os.path.basename(path)}:{line}" if line else ""
        detail = str(err).splitlines()[0] if str(err) else ""
        raise GraphFileError(f"{what} in {path!r} raised {type(err).__name__}{where}: "
                             f"{detail}") from err
