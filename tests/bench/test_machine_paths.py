"""Issue 36, item 10: the docs speak in paths relative to the checkout or in variables a
user sets ($HYBRIDFLOW_SMOLLM2_DIR, $TRL_VENV), never in the absolute paths of the
machine they were written on (`/work/venvs/trl/bin/python`, `/work/cache/smollm2-hf`).

Read: docs/*.md, README.md, and the docstrings of bench/*.py (their usage lines are
what a user copies)."""
from __future__ import annotations

import ast
import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# an absolute path into a home, a temp or a work folder of one machine; not a part of
# a URL or of a longer path (`$PWD/devices`, `https://host/home/x`)
MACHINE_PATH = re.compile(r"(?<![\w./:~$-])/(?:home|tmp|work|root|Users|mnt|scratch)/[\w.-]+")


def _docs() -> dict[str, str]:
    paths = sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) + [
        os.path.join(REPO, "README.md")]
    texts = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            texts[os.path.relpath(path, REPO)] = handle.read()
    return texts


def _bench_docstrings() -> dict[str, str]:
    texts = {}
    for path in sorted(glob.glob(os.path.join(REPO, "bench", "*.py"))):
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        texts[os.path.relpath(path, REPO)] = "\n".join(
            ast.get_docstring(n) or "" for n in nodes)
    return texts


def _found(texts: dict[str, str]) -> list[str]:
    return [f"{name}: {match.group(0)}" for name, text in texts.items()
            for match in MACHINE_PATH.finditer(text)]


def test_the_pattern_finds_the_paths_the_issue_found_and_spares_relative_ones():
    old = ("PYTHONPATH=. /work/venvs/trl/bin/python bench/real_model_trl.py "
           "--model /work/cache/smollm2-hf; echo /home/me/x > /tmp/y")
    assert len(_found({"old": old})) == 4
    fine = ("--model $HYBRIDFLOW_SMOLLM2_DIR --data data/word_arith; "
            "HYBRIDFLOW_DEVICES_DIR=$PWD/devices; https://host.org/home/page; ~/.cache/x")
    assert _found({"fine": fine}) == []


def test_docs_name_no_absolute_path_of_a_machine():
    found = _found(_docs())
    assert not found, ("write these relative to the checkout or as a variable the user "
                       "sets ($HYBRIDFLOW_SMOLLM2_DIR, $TRL_VENV): " + "; ".join(found))


def test_bench_docstrings_name_no_absolute_path_of_a_machine():
    texts = _bench_docstrings()
    assert "bench/real_model_trl.py" in texts
    found = _found(texts)
    assert not found, ("write these relative to the checkout or as a variable the user "
                       "sets ($HYBRIDFLOW_SMOLLM2_DIR, $TRL_VENV): " + "; ".join(found))
