"""Every file and module that hybridflow/'s docstrings, comments and messages name exists,
so a folder move or a rename cannot leave the docs pointing at files that are gone
(issue 31: 11 docstrings still named files from before the folder move).

- a `*.py` or `*.md` path resolves against the repository, the package, `docs/` or the
  naming module's folder or one above it (`plan/async_split.py`, `signals.py` from run/);
- a dotted `hybridflow.a.b` resolves to a module, and a name after the module to one of
  its top-level names; the old paths that core/moved.py still forwards are allowed.
Examples that stand for the user's file (`graph.py`, `path/to/file.py`) and another
project's files are listed below with why."""
from __future__ import annotations

import ast
import functools
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "hybridflow")
FILE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[A-Za-z_][\w-]*\.(?:py|md))\b")
DOTTED = re.compile(r"(?<![\w.])hybridflow(?:\.[A-Za-z_]\w*)+")

# placeholders for the user's own files in usage lines and examples
EXAMPLES = {"graph.py", "g.py", "file.py", "path/to/file.py", "my_env.py",
            "random.py"}  # core/user_code.py: a user's file that would shadow a module
# another project's files, named where the code follows them
ELSEWHERE = {("workers/rollout/vllm_group.py", "vllm/distributed/parallel_state.py"),
             ("workers/rollout/vllm_group.py", "config/parallel.py")}  # vLLM's
# stale names in files being rewritten by others this turn; fixed there, then dropped here
PENDING = {("workers/rollout/vllm.py", "tests/workers/rollout/test_vllm_real.py"),
           ("plan/placement.py", "affinity.py")}  # runtime/affinity.py


def _sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, PACKAGE), path


def _wrapped(previous: str) -> str:
    """The start of a path a line break cut ('... workers/rollout/' + 'stream_store.py')."""
    found = re.search(r"(?<![\w./-])((?:[\w.-]+/)+)$", previous.rstrip())
    return found.group(1) if found else ""


def _file_exists(name: str, folder: str) -> bool:
    roots = [REPO, PACKAGE, os.path.join(REPO, "docs")]
    while folder.startswith(PACKAGE):
        roots.append(folder)
        folder = os.path.dirname(folder)
    return any(os.path.exists(os.path.join(root, name)) for root in roots)


def test_every_named_file_exists():
    missing = []
    for rel, path in _sources():
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        for number, line in enumerate(lines, 1):
            for name in FILE.findall(line):
                if line.lstrip().startswith(name) and number > 1:
                    name = _wrapped(lines[number - 2]) + name
                if name in EXAMPLES or (rel, name) in ELSEWHERE | PENDING:
                    continue
                if not _file_exists(name, os.path.dirname(path)):
                    missing.append(f"hybridflow/{rel}:{number} names {name}")
    assert not missing, "files named but not there (write the path as it is now):\n" + \
        "\n".join(missing)


@functools.lru_cache(maxsize=None)
def _top_level_names(path: str) -> frozenset[str]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _module_file(parts: list[str]) -> str | None:
    if parts[:2] in (["hybridflow", "graphs"], ["hybridflow", "algorithms"]):
        parts = parts[1:]  # the shipped library: the repository's top-level folders
    base = os.path.join(REPO, *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _dotted_problem(dotted: str) -> str | None:
    from hybridflow.core.moved import MOVED
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        path = _module_file(parts[:end])
        if path is not None:
            rest = parts[end:]
            if rest and rest[0] not in _top_level_names(path):
                return f"{'.'.join(parts[:end])} has no {rest[0]!r}"
            return None
    if any(".".join(parts[:end]) in MOVED for end in range(2, len(parts) + 1)):
        return None  # an old path core/moved.py still forwards
    return "no such module"


def test_every_named_module_exists():
    missing = []
    for rel, path in _sources():
        if rel == os.path.join("core", "moved.py"):
            continue  # the table of old paths
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        for number, line in enumerate(lines, 1):
            for dotted in DOTTED.findall(line):
                problem = _dotted_problem(dotted)
                if problem:
                    missing.append(f"hybridflow/{rel}:{number} names {dotted}: {problem}")
    assert not missing, "\n".join(missing)


def test_the_checks_catch_a_stale_name():
    """The two checks can fail: a name from before the folder move is caught."""
    assert not _file_exists("run_signals.py", os.path.join(PACKAGE, "run"))
    assert _file_exists("signals.py", os.path.join(PACKAGE, "run"))
    assert _file_exists("plan/async_split.py", os.path.join(PACKAGE, "draw"))
    assert _wrapped("samples wait on (workers/rollout/") == "workers/rollout/"
    assert _wrapped("a sentence.") == ""
    assert _dotted_problem("hybridflow.runtime.nothing_here") == \
        "hybridflow.runtime has no 'nothing_here'"
    assert _dotted_problem("hybridflow.nothing_here") == "no such module"
    assert _dotted_problem("hybridflow.core.kinds.NoSuchKind") == \
        "hybridflow.core.kinds has no 'NoSuchKind'"
    assert _dotted_problem("hybridflow.core.kinds.NodeKind") is None
    assert _dotted_problem("hybridflow.constraints") is None  # forwarded by core/moved.py
