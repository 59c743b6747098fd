"""Diagrams of graphs and plans (hybridflow/draw/graph.py) and the `render` command."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from hybridflow.plan.compiler import compile_graph
from hybridflow.graph.builder import Graph, node_fn
from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.draw import graph as render
from hybridflow.draw.graph import RenderError, edge_keys, render_graph, render_timeline
from tests.support.fakes import FAKE_ROLES

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz `dot` is not installed (apt-get install graphviz)")


@node_fn(reads=("token_level_scores", "values", "response_mask"),
         writes=("advantages", "returns"))
def gae(batch, gamma=1.0, lam=0.95): ...


@node_fn(reads=("token_level_scores", "response_mask"), writes=("advantages",),
         group_by="uid")
def group_advantages(batch): ...


BINDINGS = FAKE_ROLES


def ppo_graph() -> Graph:
    g = Graph("ppo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, name="generate", n=1)
    old = g.call("actor.logprob", rollout, name="old_logprob")
    ref = g.call("ref.logprob", rollout, name="ref_logprob")
    values = g.call("critic.values", rollout, name="values")
    score = g.call("reward.score", rollout, name="reward")
    adv = g.fn(gae, rollout, values, score, name="advantages", lam=0.95)
    g.call("actor.update", rollout, old, ref, adv, name="update_actor")
    g.call("critic.update", rollout, values, adv, name="update_critic")
    return g


def grpo_graph() -> Graph:
    g = Graph("grpo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=4)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(group_advantages, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g


def ppo_placement() -> Placement:
    return Placement({"main": PoolSpec("main", 1, 4), "critic_pool": PoolSpec("critic_pool", 1, 2)},
                     {"actor": "main", "ref": "main", "reward": "main", "critic": "critic_pool"},
                     parallel={"actor": {"dp": 2, "tp": 2}})


def ppo_plan():
    return compile_graph(ppo_graph(), BINDINGS, ppo_placement())


def grpo_plan():
    bindings = {k: v for k, v in BINDINGS.items() if k != "critic"}
    return compile_graph(grpo_graph(), bindings, Placement.single_pool(bindings, devices=8))


def svg_texts(path) -> list[str]:
    """Every text run of an SVG file (graphviz writes one <text> per label line)."""
    root = ET.parse(path).getroot()
    return [el.text or "" for el in root.iter() if el.tag.endswith("text")]


def all_edge_keys(plan) -> set[str]:
    return {k for n in plan.nodes for d in n.deps for k in edge_keys(plan, d, n.name)[0]}


# --------------------------------------------------------------- edge keys
def test_edge_keys_are_the_keys_the_consumer_reads_from_that_producer():
    plan = ppo_plan()
    read, passed = edge_keys(plan, "generate", "advantages")
    assert read == ["response_mask"]
    assert "uid" in passed and "input_ids" in passed
    assert edge_keys(plan, "values", "advantages") == (["values"], [])
    assert edge_keys(plan, "reward", "advantages") == (["token_level_scores"], ["scores"])
    assert edge_keys(plan, "ref_logprob", "update_actor")[0] == ["ref_log_prob"]


def test_forwarded_keys_are_drawn_on_the_edge_that_carries_them():
    plan = grpo_plan()  # uid comes from the source, through generate's forwarding
    read, _ = edge_keys(plan, "actor.generate", "group_advantages")
    assert "uid" in read and "response_mask" in read
    # generate overwrites input_ids: the key comes from generate, not from the source
    assert "input_ids" in edge_keys(plan, "prompts", "actor.generate")[0]
    assert "input_ids" in edge_keys(plan, "actor.generate", "actor.logprob")[0]


def test_role_colors_are_stable_and_distinct():
    a = render.role_colors(["actor", "critic", "ref", "reward"])
    b = render.role_colors(["reward", "actor", "ref", "critic", "rollout"])
    assert len(set(a.values())) == 4
    assert len(set(b.values())) == 5
    assert render.role_colors(["actor"])["actor"] == a["actor"] == b["actor"]


def test_every_kind_has_its_own_shape():
    shapes = {render.KIND_SHAPES[k] for k in ("source", "generate", "inference", "train",
                                              "function")}
    assert len(shapes) == 5


# --------------------------------------------------------------- graph diagrams
@needs_dot
@pytest.mark.parametrize("make_plan", [ppo_plan, grpo_plan])
def test_svg_shows_every_node_and_every_edge_key(tmp_path, make_plan):
    plan = make_plan()
    out = render_graph(plan, tmp_path / "g.svg")
    texts = set(svg_texts(out))
    for node in plan.nodes:
        assert node.name in texts, node.name
    words = {w for text in texts for w in re.split(r"[,\s]+", text)}
    keys = all_edge_keys(plan)
    assert keys and keys <= words, keys - words
    for kind in {n.kind for n in plan.nodes}:  # legend
        assert kind in texts
    for role in plan.roles:
        assert f"role {role}" in texts


def test_plan_draws_a_sequence_parallel_layout_and_generation_without_sp():
    """dp x sp x tp of each sharded role; a role generating on a module that runs
    sequence-parallel says the layout it generates at (generation never splits)."""
    bindings = {k: v for k, v in BINDINGS.items() if k != "critic"}
    placement = Placement({"main": PoolSpec("main", 1, 8)},
                          {r: "main" for r in bindings},
                          parallel={"actor": {"sp": 2}, "ref": {"sp": 4}})
    plan = compile_graph(grpo_graph(), bindings, placement)
    label = render._pool_label(plan, "main")
    assert label == ("pool main · 8 devices · actor (dp 4 × sp 2, generates at dp 8), "
                     "ref (dp 2 × sp 4), reward"), label
    source = render.plan_to_dot(plan, show_plan=True).source
    assert "actor (dp 4 × sp 2, generates at dp 8)" in source


@needs_dot
def test_plan_svg_draws_pools_with_devices_and_colocated_roles(tmp_path):
    plan = ppo_plan()
    texts = svg_texts(render_graph(plan, tmp_path / "p.svg", show_plan=True))
    assert "pool main · 4 devices · actor (dp 2 × tp 2), ref, reward" in texts
    assert "pool critic_pool · 2 devices · critic" in texts
    source = render.plan_to_dot(plan, show_plan=True).source
    pool_block = source.split("subgraph cluster_pool_main")[1].split("}")[0]
    from hybridflow.plan.sites import fn_site  # a function node sits where it runs
    fn = next(n for n in plan.nodes if n.op == "fn")
    home = fn_site(plan, fn).pool
    assert "generate" in pool_block and (fn.name in pool_block) == (home == "main")
    assert "prompts" not in pool_block  # a source stays on the driver


def test_multi_node_pool_label():
    plan = ppo_plan()
    plan.placement.pools["main"] = PoolSpec("main", 2, 8)
    assert render._pool_label(plan, "main").startswith("pool main · 2 nodes × 8 devices")


@needs_dot
def test_png_and_pdf_are_written(tmp_path):
    png = render_graph(ppo_plan(), tmp_path / "g.png", show_plan=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pdf = render_graph(grpo_plan(), tmp_path / "g.pdf")
    assert pdf.read_bytes()[:4] == b"%PDF"


def test_dot_source_is_written_without_graphviz_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` on PATH
    out = render_graph(ppo_plan(), tmp_path / "g.dot", show_plan=True)
    text = out.read_text()
    assert text.startswith("digraph ppo") and "cluster_pool_main" in text
    assert "old_log_probs" in text


def test_image_formats_without_dot_fail_with_an_install_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RenderError, match="apt-get install graphviz"):
        render_graph(ppo_plan(), tmp_path / "g.svg")


def test_unknown_extension_is_rejected(tmp_path):
    with pytest.raises(RenderError, match=r"\.svg, \.png, \.pdf, \.dot"):
        render_graph(ppo_plan(), tmp_path / "g.jpg")


# --------------------------------------------------------------- timeline
def fake_records():
    rows = []
    for step, t in ((1, 0.0), (2, 10.0)):
        rows += [
            {"step": step, "node": "prompts", "role": None, "pool": None,
             "start": t, "end": t + .1},
            {"step": step, "node": "generate", "role": "actor", "pool": "main",
             "start": t + .1, "end": t + 3},
            {"step": step, "node": "values", "role": "critic", "pool": "critic_pool",
             "start": t + 3, "end": t + 4},
            {"step": step, "node": "old_logprob", "role": "actor", "pool": "main",
             "start": t + 3, "end": t + 4},
            {"step": step, "node": "ref_logprob", "role": "ref", "pool": "main",
             "start": t + 4, "end": t + 5},
            {"step": step, "node": "advantages", "role": None, "pool": None,
             "start": t + 5, "end": t + 5.2},
            {"step": step, "node": "update_actor", "role": "actor", "pool": "main",
             "start": t + 5.2, "end": t + 8},
            {"step": step, "node": "update_critic", "role": "critic", "pool": "critic_pool",
             "start": t + 5.2, "end": t + 7},
        ]
    return rows


def test_timeline_has_one_row_per_pool_and_every_node(tmp_path):
    out = render_timeline(fake_records(), tmp_path / "t.svg")
    root = ET.parse(out).getroot()
    rows = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "row"]
    assert [r.get("data-pool") for r in rows] == ["pool critic_pool", "pool main", "driver"]
    texts = svg_texts(out)
    for name in ("prompts", "generate", "values", "old_logprob", "ref_logprob", "advantages",
                 "update_actor", "update_critic"):
        assert name in texts
    assert texts[0].startswith("step 2 ·")  # the last step by default


def test_timeline_step_choice_and_overlap_lanes(tmp_path):
    records = fake_records()
    records.append({"step": 1, "node": "extra", "role": None, "pool": None,
                    "start": 0.05, "end": 0.3})  # overlaps prompts: a second lane
    svg = render.timeline_svg(records, step=1)
    assert svg.count('class="bar"') == 9 and "step 1 ·" in svg
    with pytest.raises(RenderError, match="recorded steps: \\[1, 2\\]"):
        render.timeline_svg(records, step=7)
    with pytest.raises(RenderError, match=r"\.svg"):
        render_timeline(records, tmp_path / "t.png")


# --------------------------------------------------------------- the command
def parse(argv):
    from hybridflow.commands import render as command
    from hybridflow.commands.args import IntermixedParser
    parser = argparse.ArgumentParser(prog="hybridflow")
    command.add_parser(parser.add_subparsers(dest="command", parser_class=IntermixedParser))
    return command, parser.parse_args(argv)


def test_command_renders_a_timeline_from_a_run_dir(tmp_path, capsys):
    (tmp_path / "timeline.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in fake_records()))
    command, args = parse(["render", "--timeline", str(tmp_path), "-o",
                           str(tmp_path / "t.svg"), "--step", "1"])
    assert command.run(args) == 0
    assert "step 1 ·" in (tmp_path / "t.svg").read_text()
    command, args = parse(["render", "--timeline", str(tmp_path / "nowhere"), "-o",
                           str(tmp_path / "t.svg")])
    assert command.run(args) == 1
    assert "timeline.jsonl" in capsys.readouterr().err


def test_command_renders_a_graph_file_with_overrides(tmp_path, monkeypatch, capsys):
    program = pytest.importorskip("hybridflow.program.assemble")
    seen = {}

    def fake_prepare(path, overrides, preflight=True):
        from types import SimpleNamespace

        from hybridflow.program.config import build_config
        seen.update(path=str(path), overrides=list(overrides))
        return SimpleNamespace(plan=ppo_plan(), cfg=build_config(None, None, []))

    monkeypatch.setattr(program, "prepare", fake_prepare)
    command, args = parse(["render", "graph.py", "-o", str(tmp_path / "g.dot"), "--plan",
                           "rollout.n=4"])
    assert command.run(args) == 0
    assert seen == {"path": "graph.py", "overrides": ["rollout.n=4"]}
    assert "cluster_pool_main" in (tmp_path / "g.dot").read_text()
    assert str(tmp_path / "g.dot") in capsys.readouterr().out


def test_command_reports_graph_errors_and_returns_1(tmp_path, monkeypatch, capsys):
    program = pytest.importorskip("hybridflow.program.assemble")
    from hybridflow.plan.compiler import GraphError

    def failing(path, overrides, preflight=True):
        raise GraphError("ppo", ["node 'x' (g.py:3): reads key 'y'"])

    monkeypatch.setattr(program, "prepare", failing)
    command, args = parse(["render", "graph.py", "-o", str(tmp_path / "g.svg")])
    assert command.run(args) == 1
    assert re.search(r"reads key 'y'", capsys.readouterr().err)


def test_command_needs_a_graph_or_a_timeline(tmp_path, capsys):
    command, args = parse(["render", "-o", str(tmp_path / "g.svg")])
    assert command.run(args) == 1
    assert "graph file" in capsys.readouterr().err


# --------------------------------------------------------------- async sides
def async_plan(staleness: int = 1):
    from hybridflow.plan.async_split import attach_staleness
    return attach_staleness(ppo_plan(), staleness, allow_uncorrected=True)


def dot_block(source: str, cluster: str) -> str:
    """The DOT text of one cluster, up to its closing brace."""
    start = source.index(f"subgraph {cluster} {{")
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0 and source[i] == "}":
            return source[start:i]
        i += 1


def edge_line(source: str, a: str, b: str) -> str:
    return next(line for line in source.splitlines() if line.strip().startswith(f"{a} -> {b} "))


def node_line(source: str, name: str) -> str:
    quoted = re.escape(f'"{name}"') if "/" in name else re.escape(name)
    return next(x for x in source.splitlines() if re.match(rf"\s*{quoted} \[", x))


def buffered_edge(source: str, a: str, b: str) -> str:
    return next(line for line in source.splitlines()
                if line.strip().startswith((f'{a} -> "{b}" ', f'"{a}" -> {b} ')))


def test_an_async_plan_is_drawn_as_two_sides_with_its_buffer_nodes_between():
    from hybridflow.plan.async_split import BUFFER_PREFIX, sides_of
    plan = async_plan()
    sides = sides_of(plan)
    source = render.plan_to_dot(plan).source
    rollout, train = dot_block(source, "cluster_side_rollout"), \
        dot_block(source, "cluster_side_train")
    assert 'label="rollout side (runs 1 step ahead)"' in rollout
    assert 'label="train side"' in train
    for name in sides.rollout:
        assert re.search(rf"^\s*{name} \[", rollout, re.M) and name not in train, name
    for name in sides.train:
        assert re.search(rf"^\s*{name} \[", train, re.M), name
    crossing = sides.crossing_edges(plan)
    assert ("generate", "update_actor") in crossing and ("reward", "advantages") in crossing
    for producer, consumer in crossing:  # through the buffer, drawn like any node
        buffer = BUFFER_PREFIX + producer
        line = node_line(source, buffer)
        assert "shape=cds" in line and "capacity 1" in line and buffer not in rollout + train
        assert "waits ≤1 step" in buffered_edge(source, producer, buffer)
        assert render.CROSSING_COLOR in buffered_edge(source, buffer, consumer)
    for node in plan.nodes:  # no other edge waits
        for dep in node.deps:
            if node.op != "buffer" and plan.node(dep).op != "buffer":
                assert "waits" not in edge_line(source, dep, node.name)
    assert "async: trainer.staleness=1" in source
    assert "≤2 steps" in render.plan_to_dot(async_plan(2)).source


def test_the_placement_view_of_an_async_plan_outlines_the_rollout_side():
    from hybridflow.plan.async_split import sides_of
    plan = async_plan()
    source = render.plan_to_dot(plan, show_plan=True).source
    assert "cluster_side_" not in source and "cluster_pool_main" in source
    for node in plan.nodes:
        line = node_line(source, node.name)
        assert (render.ROLLOUT_SIDE_COLOR in line) == (node.name in sides_of(plan).rollout)
    assert "waits ≤1 step" in buffered_edge(source, "ref_logprob", "buffer/ref_logprob")
    assert "rollout side (1 step ahead)" in source  # the legend


def test_a_synchronous_plan_has_no_sides_drawn():
    for show_plan in (False, True):
        source = render.plan_to_dot(ppo_plan(), show_plan=show_plan).source
        assert "cluster_side" not in source and "waits" not in source
        assert render.ROLLOUT_SIDE_COLOR not in source and "async" not in source


@needs_dot
def test_async_svg_names_the_sides_and_the_wait(tmp_path):
    texts = set(svg_texts(render_graph(async_plan(), tmp_path / "g.svg")))
    assert {"rollout side (runs 1 step ahead)", "train side", "waits ≤1 step"} <= texts
