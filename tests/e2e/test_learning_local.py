"""End to end on the local runtime: the embedded default learns the toy task."""
import json
import os

from tests.support.e2e import series, train

VAL = "val/toy_arith/greedy"


def test_grpo_embedded_default_raises_held_out_accuracy(tmp_path):
    trainer, metrics = train("grpo", tmp_path, "trainer.steps=30", "trainer.val_every=15")
    accuracy = series(metrics, VAL)
    assert accuracy[0] < 0.5, "the shipped base model should leave RL something to do"
    assert accuracy[-1] >= accuracy[0] + 0.4, accuracy
    assert max(series(metrics, "critic/score/mean")[-5:]) > series(metrics, "critic/score/mean")[0]
    run = trainer.run
    assert json.load(open(run.file("status.json")))["state"] == "finished"
    assert os.path.isfile(run.file("config.yaml"))
    assert any(name.startswith("step_") for name in os.listdir(run.checkpoints))
    for key in ("actor/pg_loss", "timing_s/rollout.generate", "perf/time_per_step",
                "engine/driver_bytes"):
        assert key in metrics[-1], key


def test_tensorboard_events_are_written(tmp_path):
    trainer, _ = train("grpo", tmp_path, "trainer.steps=1", "trainer.val_every=0",
                       "trainer.tensorboard=true", "data.batch_size=4", "rollout.n=2",
                       "actor.mini_batch_size=8")
    events = os.listdir(os.path.join(trainer.run.path, "tensorboard"))
    assert any(name.startswith("events.out.tfevents") for name in events)
