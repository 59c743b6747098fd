"""A metric that two nodes of a graph report (two `reward.score` nodes, two
`rollout.generate` nodes) shows the value of the training samples' node."""
from __future__ import annotations

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir
from tests.support.e2e import graph_file


def test_remax_reports_the_samples_score_not_the_greedy_baselines(tmp_path):
    loaded = prepare(graph_file("remax"), [f"trainer.runs_dir={tmp_path}", "trainer.val_every=0",
                                           "data.batch_size=8", "rollout.n=4",
                                           "actor.mini_batch_size=32", "actor.micro_batch_size=32"])
    trainer = Trainer(loaded, new_run_dir(str(tmp_path), "remax"))
    try:
        result = trainer.runtime.run_step({"prompts": trainer.train_loader.next_batch()})
    finally:
        trainer.close()
    sampled = {"critic/score/mean": "reward.score", "response_length/mean": "rollout.generate"}
    for key, node in sampled.items():
        assert result.metrics[key] == result.node_metrics[node][key], key
    assert result.node_metrics["baseline"]["critic/score/mean"] != \
        result.node_metrics["reward.score"]["critic/score/mean"]  # the test can tell them apart
