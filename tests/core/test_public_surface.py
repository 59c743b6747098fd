"""Issue 32, class 9: user files do not break when the package moves.

One public surface: everything a graph file, a worker, a loss, a scorer or an
environment needs imports from `hybridflow` (or the documented public modules
`hybridflow.agents`, `hybridflow.planner`). This test holds the list; every import in
the docs and in graphs/ uses only it; every module path from before the folder move
still imports, with a warning naming the import to write, and a name that is not
there fails naming where it lives now."""
from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import os
import re
import sys
import warnings

import pytest

import hybridflow
from hybridflow.core.moved import MOVED, SHADOWED, MovedImportWarning

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC_MODULES = ("hybridflow", "hybridflow.agents", "hybridflow.planner")
SHIPPED_LIBRARY = ("hybridflow.graphs", "hybridflow.algorithms")  # and their modules
SURFACE = {  # the public names: removing or renaming one breaks users' files
    "Batch", "Graph", "node_fn", "loss_fn", "register_default_loss", "method",
    "register_dispatch_mode", "Layout", "SlotLayout", "BROADCAST", "DP", "DP_TP",
    "ONE_PER_WORKER", "RANK_ZERO", "checked", "at_least", "above", "in_range", "one_of",
    "probability", "ConfigError", "masked_mean", "training_mask", "printable", "load_batch",
    "register_engine", "declare_engine_memory", "EngineMemory", "register_setting_names",
    "load_tokenizer", "tokenizer_spec", "read_rows", "write_rows", "SHAPED_REWARD_MEAN",
    "ZERO_STD_GROUPS",
}


def test_the_public_surface_is_the_held_list_and_every_name_resolves():
    assert set(hybridflow.__all__) == SURFACE
    for name in SURFACE:
        assert getattr(hybridflow, name) is not None, name
    namespace: dict = {}
    exec("from hybridflow import *", namespace)  # the star import users write
    assert SURFACE <= set(namespace)


def _imports(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hybridflow"):
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name.startswith("hybridflow"))


def _doc_imports():
    """(file, module, names) of each hybridflow import in the docs' code and graphs/."""
    for path in sorted(glob.glob(os.path.join(REPO, "graphs", "**", "*.py"), recursive=True)):
        if path == os.path.join(REPO, "graphs", "__init__.py"):
            continue  # the package's own old-name machinery (core/shipped.py's adopt)
        with open(path, encoding="utf-8") as handle:
            for module, names in _imports(handle.read()):
                yield os.path.relpath(path, REPO), module, names
    docs = glob.glob(os.path.join(REPO, "docs", "*.md")) + [os.path.join(REPO, "README.md")]
    line = re.compile(r"^\s*(from hybridflow[\w.]* import [\w, ()]+|import hybridflow[\w.]*)",
                      re.M)
    for path in sorted(docs):
        with open(path, encoding="utf-8") as handle:
            for match in line.finditer(handle.read()):
                text = match.group(1).strip().rstrip("(").replace("(", "").replace(")", "")
                if text.endswith(","):
                    continue  # a wrapped import: its first line is checked by the graphs
                for module, names in _imports(text):
                    yield os.path.relpath(path, REPO), module, names


DOC_IMPORTS = list(_doc_imports())


def _public(module: str) -> bool:
    return module in PUBLIC_MODULES or module in SHIPPED_LIBRARY or module.startswith(
        tuple(f"{name}." for name in SHIPPED_LIBRARY))


def test_docs_and_graphs_import_only_the_public_surface():
    private = [f"{file}: from {module} import {', '.join(names)}"
               for file, module, names in DOC_IMPORTS if not _public(module)]
    assert not private, "import these from hybridflow (the public surface): " + "; ".join(private)
    assert len(DOC_IMPORTS) >= 30


@pytest.mark.parametrize("file,module,names", DOC_IMPORTS)
def test_every_documented_import_works(file, module, names):
    imported = importlib.import_module(module)
    for name in names:  # `from package import submodule` imports it, as Python does
        if not hasattr(imported, name) and hasattr(imported, "__path__"):
            importlib.util.find_spec(f"{module}.{name}") and importlib.import_module(
                f"{module}.{name}")
        assert hasattr(imported, name), f"{file}: {module} has no {name}"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_module_path_from_before_the_move_imports_with_a_warning(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    said = [str(w.message) for w in caught if issubclass(w.category, MovedImportWarning)]
    assert said and MOVED[old] in said[0] and "instead" in said[0], said
    assert issubclass(MovedImportWarning, DeprecationWarning)
    for name in getattr(new, "__all__", ()):  # the same objects, not copies
        assert getattr(module, name) is getattr(new, name)


def test_the_issue_cases_import_and_public_names_are_advised():
    for old in ("hybridflow.constraints", "hybridflow.loss"):
        sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from hybridflow.constraints import at_least, checked
        from hybridflow.loss import loss_fn
    assert at_least is hybridflow.at_least and checked is hybridflow.checked
    assert loss_fn is hybridflow.loss_fn
    said = " ".join(str(w.message) for w in caught)
    assert "from hybridflow import" in said and "at_least" in said and "loss_fn" in said


def test_a_name_that_is_not_there_fails_naming_where_it_lives_now():
    with pytest.raises(ImportError, match="from hybridflow import masked_mean"):
        from hybridflow.constraints import masked_mean  # noqa: F401
    with pytest.raises(ImportError, match="it is defined in hybridflow.program.assemble"):
        from hybridflow.loss import prepare  # noqa: F401
    with pytest.raises(ImportError, match="no module defines it now"):
        from hybridflow.loss import no_such_name  # noqa: F401


def test_a_lookup_that_is_not_an_import_gets_an_attribute_error():
    """pickle, cloudpickle and getattr(module, name, default) search sys.modules and
    expect AttributeError from a module that lacks a name."""
    import pickle

    import hybridflow.constraints as old
    assert getattr(old, "masked_mean", None) is None and not hasattr(old, "prepare")
    assert getattr(importlib.import_module("hybridflow.graph"), "prepare", None) is None
    assert pickle.whichmodule(test_a_lookup_that_is_not_an_import_gets_an_attribute_error,
                              "test_a_lookup_that_is_not_an_import_gets_an_attribute_error")


@pytest.mark.parametrize("package", sorted(SHADOWED))
def test_old_modules_that_are_packages_now_still_give_their_names(package):
    old = importlib.import_module(SHADOWED[package])
    names = [n for n in getattr(old, "__all__", ()) if n not in dir(
        importlib.import_module(package))]
    for name in names:
        with pytest.warns(MovedImportWarning, match=SHADOWED[package]):
            assert getattr(importlib.import_module(package), name) is getattr(old, name)


def test_a_worker_file_written_to_the_old_docs_still_runs(tmp_path, capsys):
    from hybridflow.cli import main
    worker = tmp_path / "teacher_worker.py"
    worker.write_text("from hybridflow.constraints import at_least, checked\n"
                      "from hybridflow.loss import loss_fn\n"
                      "from hybridflow.workers import DEFAULT_ROLES\n"
                      "Actor = DEFAULT_ROLES['actor']\n")
    code = main(["check", os.path.join(REPO, "graphs", "grpo.py"),
                 f"workers.actor={worker}:Actor"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "ok" in out.out
