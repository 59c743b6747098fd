"""bench/'s scripts import one another without a circle (issue 37 found two: gpu.py and
gpu_tp.py, parallel.py and parallel_workers.py): what two scripts share lives in a
module they both import (bench/harness.py, bench/workload.py). Imports inside functions
count: a circle there works only by the order things happen to run."""
from __future__ import annotations

import ast
import glob
import os

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench")


def bench_imports(source: str, modules: set[str]) -> set[str]:
    """The bench modules a file's source imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names
                  if n.startswith("bench.") and n.split(".")[1] in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = glob.glob(os.path.join(BENCH, "*.py"))
    modules = {os.path.basename(p)[:-3] for p in paths}
    graph = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            name = os.path.basename(path)[:-3]
            graph[name] = bench_imports(handle.read(), modules) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per circle found by a depth-first walk."""
    found, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                walk(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return found


def test_no_bench_script_imports_one_that_imports_it_back():
    graph = import_graph()
    assert {"harness", "gpu", "gpu_tp", "parallel", "parallel_workers"} <= set(graph)
    assert graph["gpu"] >= {"gpu_tp"} and graph["parallel"] >= {"parallel_workers"}
    assert not cycles(graph), f"import circles in bench/: {cycles(graph)}; move what they " \
                              "share to bench/harness.py"


def test_the_circle_check_sees_imports_inside_functions():
    source = ("from bench import workload\nimport bench.harness\n"
              "def f():\n    from bench.gpu import QWEN2_05B\n")
    assert bench_imports(source, {"workload", "harness", "gpu"}) == {"workload", "harness",
                                                                      "gpu"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
