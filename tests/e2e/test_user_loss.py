"""A loss written in the user's graph file is the loss the actor optimises, end to end
on the local runtime: the same graph with the loss's sign flipped makes the policy
stop at once or never stop, and the loss's own metric moves the way it says."""
import os
import re

from tests.support.e2e import REPO, series
from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir

GRAPH = '''
import torch

from hybridflow import Graph
from hybridflow.graph.loss import loss_fn
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

from graphs.common import embedded_defaults

SIGN = {sign}


class EosLoss:
    """Raise (SIGN=+1) or lower (SIGN=-1) the log-prob of EOS at every response token."""

    def __init__(self, eos_id):
        self.eos_id = eos_id
        loss_fn()(self)

    def __call__(self, micro, out):
        eos = torch.log_softmax(out.logits, -1)[..., self.eos_id]
        loss = -SIGN * out.mean(eos)
        return loss, {{"eos_logp": out.mean(eos.detach())}}


def defaults():
    return embedded_defaults()


def build(cfg):
    g = Graph("eos")
    rollout = g.call("actor.generate", g.source("prompts"), n=cfg.rollout.n)
    eos = load_tokenizer(tokenizer_spec(cfg.model)).eos_token_id
    g.call("actor.update", rollout, loss=EosLoss(eos))
    return g
'''


def _run(tmp_path, sign: int) -> list[dict]:
    path = tmp_path / f"eos_{sign}.py"
    path.write_text(GRAPH.format(sign=sign))
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                                 "trainer.steps=4", "trainer.val_every=0", "data.batch_size=8",
                                 "rollout.n=2", "actor.lr=1e-2", "actor.mini_batch_size=16",
                                 "actor.micro_batch_size=16"])
    run = new_run_dir(str(tmp_path / str(sign)), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return run.read_metrics()


def test_the_graph_files_loss_is_the_one_optimised(tmp_path):
    stop, run_on = _run(tmp_path, 1), _run(tmp_path, -1)
    up, down = series(stop, "actor/eos_logp"), series(run_on, "actor/eos_logp")
    assert up[-1] > up[0] + 1.0 and down[-1] < down[0] - 1.0, (up, down)
    assert "actor/pg_loss" not in stop[-1]  # no default loss ran beside it
    lengths = series(stop, "response_length/mean"), series(run_on, "response_length/mean")
    assert lengths[0][-1] < lengths[1][-1], lengths


def test_the_tutorials_reinforce_loss_trains(tmp_path):
    text = open(os.path.join(REPO, "docs", "tutorial.md")).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                 if b.startswith("# graphs/grpo_reinforce.py"))
    path = tmp_path / "grpo_reinforce.py"
    path.write_text(block)
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                                 "trainer.steps=2", "trainer.val_every=0",
                                 "data.batch_size=4", "rollout.n=4",
                                 "actor.mini_batch_size=16"])
    update = next(n for n in loaded.plan.nodes if n.method == "update")
    assert "old_log_probs" not in update.reads  # the loss's keys, not the default's
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    last = run.read_metrics()[-1]
    assert "actor/pg_loss" in last and "actor/ppo_kl" not in last
