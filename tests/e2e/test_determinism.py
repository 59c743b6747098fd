"""Same seed, same metrics; a resumed run continues exactly where it stopped. On Ray
too (same runtime, same placement): worker generators are seeded per rank and saved."""
import json
import shutil

import pytest

from tests.support.e2e import train
from tests.support.runs import FAST, stable

# Per runtime: the overrides of every run (Ray: two colocated data-parallel ranks).
RUNS = {"local": FAST,
        "ray": (*FAST, "runtime.name=ray", "placement.pools.main.devices_per_node=2")}


def _comparable(metrics):
    """What two runs of one seed agree on: no wall-clock figure, no runtime timing."""
    return [{k: v for k, v in m.items() if not k.startswith("runtime/")} for m in stable(metrics)]


def test_two_runs_with_one_seed_give_identical_metrics(tmp_path, runtime_name):
    args = RUNS[runtime_name]
    _, first = train("grpo", tmp_path / "a", "trainer.steps=3", *args)
    _, second = train("grpo", tmp_path / "b", "trainer.steps=3", *args)
    assert len(first) == 3
    assert _comparable(first) == _comparable(second)


def test_resumed_run_matches_an_uninterrupted_one(tmp_path, runtime_name):
    args = RUNS[runtime_name]
    _, whole = train("grpo", tmp_path / "whole", "trainer.steps=4", *args)
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *args)
    _, resumed = train("grpo", tmp_path / "part", "trainer.steps=4", *args,
                       resume=trainer.run.path)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]  # appended to the same file
    assert _comparable(resumed) == _comparable(whole)


def test_a_resume_of_a_run_with_steps_and_no_checkpoint_is_refused(tmp_path):
    """Issue 36 item 0: killed before its first save, a run that wrote steps is not
    started again at step 0 over them (it was, and its records were rewritten)."""
    from hybridflow.run.lifecycle import ResumeError
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *FAST)
    shutil.rmtree(trainer.run.checkpoints)  # as if killed before its first save
    with open(trainer.run.file("timeline.jsonl")) as fh:
        timeline = fh.read()
    with pytest.raises(ResumeError, match="no checkpoint to resume from"):
        train("grpo", tmp_path / "part", "trainer.steps=2", *FAST, resume=trainer.run.path)
    assert [m["step"] for m in trainer.run.read_metrics()] == [1, 2]
    with open(trainer.run.file("timeline.jsonl")) as fh:
        assert fh.read() == timeline


def test_resumed_run_redraws_the_timeline_of_redone_steps_once(tmp_path):
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=3", "trainer.save_every=1",
                       *FAST)
    shutil.rmtree(f"{trainer.run.checkpoints}/step_000003")  # killed after step 3's save
    train("grpo", tmp_path / "part", "trainer.steps=3", *FAST, resume=trainer.run.path)
    with open(trainer.run.file("timeline.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    assert sorted({r["step"] for r in records}) == [1, 2, 3]
    assert len(records) == len({(r["step"], r["node"]) for r in records})


def test_resumed_ppo_keeps_its_adaptive_kl_coefficient(tmp_path):
    ppo = (*FAST, "critic.mini_batch_size=32", "critic.micro_batch_size=32",
           "algorithm.kl_target=0.001", "algorithm.kl_coef=0.1")
    _, whole = train("ppo", tmp_path / "whole", "trainer.steps=3", *ppo)
    trainer, _ = train("ppo", tmp_path / "part", "trainer.steps=2", *ppo)
    _, resumed = train("ppo", tmp_path / "part", "trainer.steps=3", *ppo,
                       resume=trainer.run.path)
    key = "actor/reward_kl_penalty_coeff"
    assert whole[2][key] != whole[0][key]  # the controller did adapt
    assert resumed[2][key] == whole[2][key]


def test_the_last_step_is_saved_once(tmp_path, monkeypatch):
    import hybridflow.run.loop
    saved, save = [], hybridflow.run.loop.save_checkpoint

    def recording_save(root, step, *args, **kwargs):
        saved.append(step)
        return save(root, step, *args, **kwargs)
    monkeypatch.setattr(hybridflow.run.loop, "save_checkpoint", recording_save)
    trainer, _ = train("grpo", tmp_path, "trainer.steps=2", "trainer.save_every=1", *FAST)
    assert saved == [1, 2]
    train("grpo", tmp_path, "trainer.steps=2", *FAST, resume=trainer.run.path)
    assert saved == [1, 2]  # a finished run resumed has nothing new to save


def test_resume_alone_finds_a_run_by_its_run_name(tmp_path):
    from hybridflow.cli import main
    from tests.support.e2e import graph_file
    args = [graph_file("grpo"), f"trainer.runs_dir={tmp_path}", "trainer.run_name=mine",
            "trainer.progress=false", *FAST]
    assert main(["run", *args, "trainer.steps=1"]) == 0
    assert main(["run", *args, "trainer.steps=2", "--resume"]) == 0
    with open(tmp_path / "mine" / "metrics.jsonl") as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 2]


def test_resumed_sft_draws_the_same_examples(tmp_path):
    sft = ("trainer.val_every=0", "data.batch_size=8", "actor.mini_batch_size=8",
           "actor.micro_batch_size=8")
    _, whole = train("sft", tmp_path / "whole", "trainer.steps=3", *sft)
    trainer, _ = train("sft", tmp_path / "part", "trainer.steps=2", *sft)
    _, resumed = train("sft", tmp_path / "part", "trainer.steps=3", *sft,
                       resume=trainer.run.path)
    assert stable(resumed) == stable(whole)
