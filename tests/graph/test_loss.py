"""Losses chosen by the graph (hybridflow/graph/loss.py): a loss passed to a training node
brings the keys it reads into the compiler's check, an undeclared loss is refused
before launch, calls without a loss get the registered default, and the engine
imports nothing from algorithms/."""
from __future__ import annotations

import ast
import os

import pytest

import hybridflow.graph.loss as loss_module
from hybridflow.plan.compiler import GraphError, compile_graph
from hybridflow.graph.dispatch import DP, method
from hybridflow.graph.builder import Graph
from hybridflow.graph.loss import call_keys, default_loss, loss_fn, loss_spec, takes_loss
from hybridflow.plan.placement import Placement, PoolSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ = ("input_ids", "responses", "response_mask")


class Actor:
    @method(dispatch=DP, reads=("input_ids",), writes=SEQ, kind="generate", overwrites=SEQ,
            forwards=True)
    def generate(self, batch): ...

    @method(dispatch=DP, reads=SEQ, writes=("teacher_log_probs",))
    def logprob(self, batch): ...

    @takes_loss(model_reads=SEQ)
    @method(dispatch=DP, reads=SEQ + ("advantages",), writes=(), kind="train")
    def update(self, batch, loss=None): ...


@loss_fn(reads=("teacher_log_probs",))
def distill(micro, out):
    return (out.log_probs - micro["teacher_log_probs"]).mean(), {}


def _compile(graph: Graph):
    placement = Placement({"main": PoolSpec("main")}, {"actor": "main"})
    return compile_graph(graph, {"actor": Actor}, placement)


def _graph(with_teacher: bool, loss=distill) -> Graph:
    g = Graph("distill")
    rollout = g.call("actor.generate", g.source("prompts", keys=("input_ids",)))
    inputs = [rollout, g.call("actor.logprob", rollout)] if with_teacher else [rollout]
    g.call("actor.update", *inputs, loss=loss)
    return g


def test_a_loss_replaces_the_default_loss_keys_with_its_own():
    plan = _compile(_graph(with_teacher=True))
    update = next(n for n in plan.nodes if n.method == "update")
    assert set(update.reads) == set(SEQ) | {"teacher_log_probs"}
    assert "advantages" not in update.reads  # the default loss's key, not this one's


def test_a_key_the_loss_reads_but_no_input_provides_fails_before_launch():
    with pytest.raises(GraphError, match="teacher_log_probs") as err:
        _compile(_graph(with_teacher=False))
    assert "test_loss.py" in str(err.value)  # points at the user's line


def test_an_undeclared_loss_is_refused_with_a_hint():
    with pytest.raises(GraphError, match="@loss_fn"):
        _compile(_graph(with_teacher=True, loss=lambda micro, out: None))


def test_without_a_loss_the_method_keeps_its_declared_keys():
    reads, optional = call_keys(Actor.update, SEQ + ("advantages",), (), {})
    assert reads == SEQ + ("advantages",) and optional == ()


def test_loss_fn_declares_instances_too():
    class Scaled:
        def __init__(self, teacher: bool):
            loss_fn(reads=("teacher_log_probs",) if teacher else ())(self)

    assert loss_spec(Scaled(True)).reads == ("teacher_log_probs",)
    assert loss_spec(Scaled(False)).reads == ()


def test_default_loss_is_imported_from_the_providers_by_name(monkeypatch):
    monkeypatch.setattr(loss_module, "DEFAULT_LOSSES", {})
    monkeypatch.setattr(loss_module, "DEFAULT_LOSS_PROVIDERS", ["tests.loss_provider_sample"])
    with pytest.raises(ModuleNotFoundError):  # the provider module is looked up by name
        default_loss("actor.update", None)
    monkeypatch.setattr(loss_module, "DEFAULT_LOSS_PROVIDERS", [])
    with pytest.raises(ValueError, match="pass loss="):
        default_loss("actor.update", None)


def test_the_shipped_default_is_the_config_chosen_policy_loss():
    from hybridflow.workers.config import ActorConfig
    loss = default_loss("actor.update", ActorConfig(policy_loss="cispo", use_kl_loss=True))
    assert loss.__name__ == "cispo_loss"
    assert loss_spec(loss).reads == ("old_log_probs", "advantages", "ref_log_prob")


def _algorithms_importers() -> set[str]:
    found = set()
    for directory, _, files in os.walk(os.path.join(ROOT, "hybridflow")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not \
                    node.level else []
                if any(n == "algorithms" or n.startswith("algorithms.") for n in names):
                    found.add(module.removesuffix(".__init__"))
    return found


def test_the_engine_imports_nothing_from_algorithms():
    assert _algorithms_importers() == set(), "hybridflow/ must not import algorithms/"
