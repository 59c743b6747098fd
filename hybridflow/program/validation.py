"""The validation graph and its contract with the step loop.

A graph file may define `validation(cfg) -> Graph`; otherwise the default below runs
(greedy answers, and N samples when `trainer.val_samples > 1`). The loop reads
scores only from the nodes a validation graph *marks*:

- `validation="greedy"` (exactly one): its `scores` give `val/<data_source>/greedy`;
- `validation="sampled"` (at most one): its `scores`, grouped by `uid`, give
  `val/<data_source>/mean@N` and `best@N`.

A marked node's output must hold `scores`, and `data_source` and `uid` must reach it
(they come with the prompts); every other node's metrics are logged as `val/<name>`.
`compile_validation` checks all that before launch (`hybridflow check` and the
Trainer), naming the node and its file:line. Before issue 26 the loop read nodes by
name (`greedy_score`, `sampled_score`): for one release an unmarked graph that still
has them is read the old way, with a `NamedValidationWarning` (a DeprecationWarning,
shown) naming the line to add; the release after refuses it. Stateless.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from hybridflow.graph.builder import Graph
from hybridflow.plan.compiler import ExecutionPlan, GraphError

__all__ = ["ScoreSource", "ValidationPlan", "compile_validation", "default_validation_graph",
           "validation_runs", "check_val_only", "VALIDATION_MARKS", "NamedValidationWarning"]

VALIDATION_MARKS = ("greedy", "sampled")
# the names the loop read before the marks (issue 26): kept for one release, then refused
OLD_NAMES = {"greedy": "greedy_score", "sampled": "sampled_score"}


class NamedValidationWarning(DeprecationWarning):
    """A validation graph whose score nodes are found by their old names."""


warnings.filterwarnings("default", category=NamedValidationWarning)  # a graph's author reads it
ROW_KEYS = ("data_source", "uid")


def default_validation_graph(cfg) -> Graph:
    """Greedy answers (accuracy) and N samples (mean@N, best@N) per held-out prompt."""
    g = Graph("validation")
    prompts = g.source("prompts")
    greedy = g.call("actor.generate", prompts, n=1, do_sample=False, name="greedy")
    g.call("reward.score", greedy, name="greedy_score", validation="greedy")
    if cfg.trainer.val_samples > 1:
        sampled = g.call("actor.generate", prompts, n=cfg.trainer.val_samples,
                         do_sample=True, name="sampled")
        g.call("reward.score", sampled, name="sampled_score", validation="sampled")
    return g


@dataclass(frozen=True)
class ScoreSource:
    """Where the loop fetches one marked node's scores and each row's data_source/uid."""
    node: str                    # the marked node (its output holds `scores`)
    rows: dict[str, str]         # data_source / uid -> the node whose output holds it


@dataclass
class ValidationPlan:
    plan: ExecutionPlan
    greedy: ScoreSource
    sampled: ScoreSource | None


def validation_runs(cfg) -> bool:
    """Whether the run validates: `trainer.val_every > 0` (or `trainer.val_only`) and
    held-out prompts exist (the toy task's, or `data.val_files` when training on files)."""
    wanted = cfg.trainer.val_every > 0 or bool(cfg.trainer.get("val_only"))
    return wanted and (not cfg.data.train_files or bool(cfg.data.val_files))


def check_val_only(cfg) -> None:
    """`trainer.val_only=true` needs held-out prompts (ConfigError otherwise)."""
    if cfg.trainer.get("val_only") and not validation_runs(cfg):
        from hybridflow.core.constraints import ConfigError
        raise ConfigError("trainer.val_only=true validates on held-out prompts, but "
                          "data.train_files is set without data.val_files; set "
                          "data.val_files")


def compile_validation(module, cfg, compile_program) -> ValidationPlan:
    """Build the graph file's `validation(cfg)` (or the default), compile it with
    `compile_program(cfg, graph)` and check its marks; GraphError naming what is wrong."""
    from hybridflow.program.user_files import call_graph_file
    build = getattr(module, "validation", None)
    if callable(build):
        where = getattr(module, "__file__", None) or "the graph file"
        graph = call_graph_file(where, "validation(cfg)", build, cfg)
        if not isinstance(graph, Graph):
            raise GraphError("validation", [f"validation(cfg) in {where!r} returned "
                                            f"{type(graph).__name__}, not a hybridflow Graph"])
    else:
        graph = default_validation_graph(cfg)
    plan = compile_program(cfg, graph)
    sources, problems = _marked(graph, plan)
    if problems:
        raise GraphError(graph.name, problems)
    return ValidationPlan(plan, sources["greedy"], sources.get("sampled"))


def _marked(graph: Graph, plan: ExecutionPlan) -> tuple[dict[str, ScoreSource], list[str]]:
    nodes = {n.name: n for n in plan.nodes}
    marks: dict[str, list[str]] = {m: [] for m in VALIDATION_MARKS}
    problems: list[str] = []
    for name, built in graph.nodes.items():
        mark = built.validation
        if mark is None:
            continue
        if mark not in VALIDATION_MARKS:
            problems.append(f"{built.where()}: validation={mark!r} is not one of "
                            f"{list(VALIDATION_MARKS)}")
            continue
        marks[mark].append(name)
    _read_old_names(graph, marks)
    if not marks["greedy"]:
        problems.append(_no_greedy(graph))
    for mark, names in marks.items():
        if len(names) > 1:
            problems.append(f"nodes {names} are all marked validation={mark!r}; mark one")
    sources = {}
    for mark, names in marks.items():
        for name in names[:1]:
            node, where = nodes[name], graph.nodes[name].where()
            if "scores" not in node.output_keys:
                problems.append(f"{where}: marked validation={mark!r}, but its output has no "
                                f"'scores' (it writes {sorted(node.writes)})")
            rows = {k: _nearest_holding(k, name, nodes) for k in ROW_KEYS}
            missing = [k for k, v in rows.items() if v is None]
            if missing:
                problems.append(f"{where}: marked validation={mark!r}, but {missing} do not "
                                f"reach it (they come with the prompts: keep the source "
                                f"upstream of it)")
            sources[mark] = ScoreSource(name, rows)
    return sources, problems


def _nearest_holding(key: str, name: str, nodes: dict) -> str | None:
    """The node nearest upstream of `name` (itself first) whose output holds `key`,
    forwarded ones included: a rollout's output carries its prompts' columns, row by
    row, where the source's has one row per prompt."""
    queue, seen = [name], set()
    while queue:
        current = queue.pop(0)
        if current in seen or current not in nodes:
            continue
        seen.add(current)
        if key in nodes[current].output_keys:
            return current
        queue += list(nodes[current].deps)
    return None


def _read_old_names(graph: Graph, marks: dict[str, list[str]]) -> None:
    """A graph that marks nothing but has the nodes the loop read by name before the
    marks: those nodes, with a warning naming the line to add (one release)."""
    if any(marks.values()) or OLD_NAMES["greedy"] not in graph.nodes:
        return
    for mark, name in OLD_NAMES.items():
        node = graph.nodes.get(name)
        if node is None:
            continue
        marks[mark].append(name)
        warnings.warn(f"{node.where()}: validation graph '{graph.name}' marks no node; its "
                      f"'{name}' is read by its name as before, for this release only: add "
                      f"validation={mark!r} to it (the next release refuses an unmarked "
                      f"graph; docs/graphs.md#validation)", NamedValidationWarning,
                      stacklevel=2)


def _no_greedy(graph: Graph) -> str:
    return (f"validation graph '{graph.name}': no node is marked validation='greedy'; mark "
            f"the node whose 'scores' give held-out accuracy, e.g. g.call('reward.score', "
            f"greedy, validation='greedy') (docs/graphs.md#validation)")
