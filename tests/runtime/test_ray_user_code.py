"""A user's graph file, and the helper modules it imports from beside it, reach the
Ray workers: function nodes defined there run sharded on the workers (the tutorial's
own example, copied verbatim, and a graph that imports a helper file), and a failure
inside one is reported against the worker it ran on, not "the driver"."""
from __future__ import annotations

import os
import re
import textwrap

import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.runtime.common import NodeFailure
from hybridflow.run.tracking import new_run_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray sessions and training steps (~30 s)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_STEP = ["trainer.progress=false", "trainer.steps=1", "trainer.val_every=0",
            "runtime.name=ray", "runtime.num_cpus=4", "runtime.call_timeout_s=300"]

HELPER = """
import torch
from hybridflow import Batch

def centred(scores, uids):
    adv = torch.empty_like(scores)
    for uid in set(uids):
        rows = [i for i, u in enumerate(uids) if u == uid]
        adv[rows] = scores[rows] - scores[rows].mean()
    return adv

def explode():
    raise RuntimeError("helper exploded on purpose")
"""

GRAPH = """
from hybridflow import Batch, Graph, node_fn
from graphs.common import embedded_defaults
import adv_helper


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def helper_advantages(batch):
    adv = adv_helper.centred(batch["scores"].float(), list(batch["uid"]))
    if {explode}:
        adv_helper.explode()
    return Batch({{"advantages": adv[:, None] * batch["response_mask"]}})


def defaults():
    return embedded_defaults(rollout={{"n": 2}}, data={{"batch_size": 4}},
                             actor={{"mini_batch_size": 8}})


def build(cfg):
    g = Graph("helper_graph_{explode}")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(helper_advantages, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g
"""


def _train(path, tmp_path, *overrides):
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", *ONE_STEP, *overrides])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return run.read_metrics()


def _tutorial_graph() -> str:
    with open(os.path.join(REPO, "docs", "tutorial.md")) as fh:
        text = fh.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    return next(b for b in blocks if b.startswith("# graphs/grpo_median.py"))


def test_the_tutorial_graph_copied_verbatim_runs_on_ray(ray_session, tmp_path):
    path = tmp_path / "grpo_median.py"
    path.write_text(_tutorial_graph())
    metrics = _train(path, tmp_path, "rollout.n=2", "data.batch_size=4",
                     "actor.mini_batch_size=8")
    assert metrics and "timing_s/median_advantages" in metrics[-1]


def test_a_helper_module_beside_the_graph_file_reaches_the_workers(ray_session, tmp_path):
    (tmp_path / "adv_helper.py").write_text(textwrap.dedent(HELPER))
    path = tmp_path / "helper_graph.py"
    path.write_text(GRAPH.format(explode=False))
    metrics = _train(path, tmp_path)
    assert "timing_s/helper_advantages" in metrics[-1]


def test_a_function_node_failing_on_a_worker_is_not_reported_on_the_driver(ray_session,
                                                                           tmp_path):
    (tmp_path / "adv_helper.py").write_text(textwrap.dedent(HELPER))
    path = tmp_path / "exploding_graph.py"
    path.write_text(GRAPH.format(explode=True))
    with pytest.raises(NodeFailure) as info:
        _train(path, tmp_path)
    assert "helper exploded on purpose" in str(info.value)
    assert "the driver" not in info.value.headline
    assert "rank 0" in info.value.headline
