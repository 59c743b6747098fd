"""`hybridflow check graph.py trainer.staleness=k` (hybridflow/commands/check.py): the
async split printed with the plan, and the refusals of async_split.py reported as any
compile error is (exit 1, the node named, nothing started)."""
from __future__ import annotations

import os
import textwrap


from hybridflow.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")
FAKES = os.path.join(REPO, "tests", "support", "fakes.py")
OPT_OUT = "trainer.allow_uncorrected_async=true"


def check(capsys, *argv) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_prints_the_split_and_what_is_handed_over(capsys):
    code, out, err = check(capsys, GRPO, "trainer.staleness=2", OPT_OUT,
                           "placement.pools.gen.devices_per_node=1",
                           "placement.roles.rollout=gen")
    assert code == 0, err
    assert "async: trainer.staleness=2 (batches generated with weights up to 2 update(s) " \
           "old)" in out
    assert "rollout side: prompts, rollout.generate, reward.score, grpo_advantages, " \
           "ref.logprob" in out
    assert "train side:   actor.logprob, actor.update, weight_export, weight_sync" in out
    assert "rollout.generate -> actor.logprob" in out
    assert out.rstrip().endswith("ok")


def test_check_of_a_synchronous_run_prints_no_split(capsys):
    code, out, err = check(capsys, GRPO)
    assert code == 0, err
    assert "async:" not in out and "rollout side" not in out


def test_check_refuses_an_uncorrected_update_naming_it(capsys):
    code, out, err = check(capsys, GRPO, "trainer.staleness=1")
    assert code == 1 and out == ""
    assert "node 'actor.update' (grpo.py:" in err and "no off-policy correction" in err
    assert "trainer.allow_uncorrected_async=true" in err


def test_check_refuses_an_impossible_split_naming_the_node(tmp_path, capsys):
    path = tmp_path / "regenerate.py"
    path.write_text(textwrap.dedent("""
        from hybridflow import Graph
        from hybridflow.graph.builder import node_fn


        @node_fn(reads=("scores", "response_mask"), writes=("advantages",))
        def advantages(batch): ...


        def build(cfg):
            g = Graph("regenerate")
            rollout = g.call("actor.generate", g.source("prompts"), n=1)
            old = g.call("actor.logprob", rollout)
            g.call("actor.update", rollout, old,
                   g.fn(advantages, rollout, g.call("reward.score", rollout)))
            g.call("actor.generate", g.source("more"), old, name="regenerate", n=1)
            return g
    """))
    bindings = [f"workers.actor={FAKES}:FakeActor", f"workers.reward={FAKES}:FakeReward"]
    code, _, err = check(capsys, str(path), *bindings, "trainer.staleness=1", OPT_OUT)
    assert code == 1
    assert "node 'regenerate' (regenerate.py:" in err and "reads 'actor.logprob'" in err
    code, _, err = check(capsys, str(path), *bindings)
    assert code == 0, err


def test_check_refuses_async_without_a_generate_node(capsys):
    code, _, err = check(capsys, os.path.join(REPO, "graphs", "sft.py"),
                         "trainer.staleness=1", OPT_OUT)
    assert code == 1 and "graph 'sft' has no generate node" in err


def _own_registry(monkeypatch):
    """A registry of this test's own: other tests read the registered names."""
    from hybridflow.workers.rollout import engine
    for name in ("_ENGINES", "_STREAMING", "_TENSOR_PARALLEL"):
        monkeypatch.setattr(engine, name, type(getattr(engine, name))(getattr(engine, name)))
    return engine


def test_streaming_on_an_engine_that_does_not_declare_it_is_refused_by_check(capsys,
                                                                            monkeypatch):
    from hybridflow.workers.rollout.hf import make_hf_engine
    engine = _own_registry(monkeypatch)
    engine.register_engine("batch_only_test", make_hf_engine)  # no streams=True
    code, out, err = check(capsys, GRPO, "trainer.staleness=1", "trainer.async_mode=streaming",
                           "actor.off_policy=decoupled", "rollout.backend=batch_only_test")
    assert code == 1
    assert "node 'rollout.generate' (grpo.py:" in err  # the node, the role, the backend
    assert "role 'rollout' (RolloutWorker) streams through its rollout engine" in err
    assert "rollout.backend='batch_only_test' does not declare streaming" in err
    assert "engines that stream: hf, vllm" in err and "trainer.async_mode=pipeline" in err
    assert "register_engine(name, factory, streams=True)" in err


def test_a_registered_engine_that_declares_streaming_passes_check(capsys, monkeypatch):
    from hybridflow.workers.rollout.hf import make_hf_engine
    engine = _own_registry(monkeypatch)
    engine.register_engine("hf_streams_test", make_hf_engine, streams=True)
    code, out, err = check(capsys, GRPO, "trainer.staleness=1", "trainer.async_mode=streaming",
                           "actor.off_policy=decoupled", "rollout.backend=hf_streams_test")
    assert code == 0, err
    assert out.rstrip().endswith("ok")


def test_an_engine_factory_named_by_path_without_the_declaration_is_refused(
        capsys, monkeypatch, tmp_path):
    _own_registry(monkeypatch)
    factory = tmp_path / "my_engine.py"
    factory.write_text("from hybridflow.workers.rollout.hf import make_hf_engine\n\n\n"
                       "def batch_only(spec):\n    return make_hf_engine(spec)\n\n\n"
                       "def streaming(spec):\n    return make_hf_engine(spec)\n\n\n"
                       "streaming.streams = True\n")
    args = (GRPO, "trainer.staleness=1", "trainer.async_mode=streaming",
            "actor.off_policy=decoupled")
    code, _, err = check(capsys, *args, f"rollout.backend={factory}:batch_only")
    assert code == 1
    assert f"rollout.backend='{factory}:batch_only' does not declare streaming" in err
    assert "`streams = True` on a 'package.module:factory' factory" in err
    code, _, err = check(capsys, *args, f"rollout.backend={factory}:streaming")
    assert code == 0, err
