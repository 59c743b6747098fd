"""Issue 31: `token_versions` (the weights version that sampled each response token)
is a column like any other: declared by the generate methods that write it, so
`check` accepts a node reading it, and the node receives the real per-token versions
-- uniform in a synchronous run, mixed where a partial rollout spans a weight update
in a streaming one."""
from __future__ import annotations

import textwrap

from hybridflow.cli import main
from tests.support.e2e import train
from tests.support.runs import FAST
from tests.support.async_runs import STREAM, run_recording

GRAPH = textwrap.dedent('''
    import torch
    from hybridflow import Batch, Graph, node_fn
    from graphs import grpo, ops

    defaults, ALGORITHM = grpo.defaults, grpo.ALGORITHM


    @node_fn(reads=("token_versions", "response_mask", "policy_version"), writes=("mixed",))
    def versions_seen(batch):
        tv, real = batch["token_versions"], batch["response_mask"].bool()
        if (tv[~real] != -1).any():
            raise ValueError("token_versions on padding must be -1")
        oldest = torch.where(real, tv, tv.max() + 1).min(-1).values
        if not torch.equal(oldest, batch["policy_version"]):
            raise ValueError("a row's policy_version is its oldest token's")
        newest = torch.where(real, tv, -1).max(-1).values
        mixed = (newest != oldest).float()
        out = Batch({"mixed": mixed})
        out.meta = {"metrics": {"seen/mixed_rows_total": float(mixed.sum())}}
        return out


    def build(cfg):
        g = Graph("grpo_versions")
        prompts = g.source("prompts")
        rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
        old = g.call("actor.logprob", rollout)
        score = g.call("reward.score", rollout)
        adv = g.fn(ops.grpo_advantages, rollout, score)
        seen = g.fn(versions_seen, rollout)
        ref = g.call("ref.logprob", rollout)
        g.call("actor.update", rollout, old, adv, seen, ref, loss=ops.policy_loss(cfg.actor))
        return g
''')


def graph(tmp_path) -> str:
    """The graph file's path without `.py` (the test helpers add it)."""
    (tmp_path / "grpo_versions.py").write_text(GRAPH)
    return str(tmp_path / "grpo_versions")


def test_check_accepts_a_node_reading_token_versions_in_every_mode(tmp_path, capsys):
    for mode in ("trainer.staleness=0", "trainer.async_mode=streaming"):
        extra = ("trainer.staleness=1", "actor.off_policy=decoupled") if "stream" in mode \
            else ()
        code = main(["check", graph(tmp_path) + ".py", mode, *extra])
        assert code == 0, capsys.readouterr().err


def test_the_node_sees_each_tokens_version_when_streaming(tmp_path):
    _, seen = run_recording(tmp_path, *STREAM, "trainer.steps=4", "trainer.staleness=1",
                            "rollout.partial=true", "actor.off_policy=decoupled",
                            graph=graph(tmp_path))
    metrics = [m for _, m, _ in seen.values()]
    engine_mixed = sum(m["async/mixed_version_rows"] for m in metrics)
    node_mixed = sum(m["seen/mixed_rows_total"] for m in metrics)
    assert engine_mixed > 0 and node_mixed > 0  # the node got the engine's versions


def test_a_synchronous_run_gives_every_token_its_rows_version(tmp_path):
    _, metrics = train(graph(tmp_path), tmp_path, "trainer.steps=2", *FAST)
    assert len(metrics) == 2 and all(m["seen/mixed_rows_total"] == 0 for m in metrics)
