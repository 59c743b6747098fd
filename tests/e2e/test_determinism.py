"""Same seed, same metrics; a resumed run continues exactly where it stopped."""
import pytest

from tests.e2e.helpers import train

FAST = ("trainer.val_every=0", "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
        "actor.micro_batch_size=32")


def _stable(metrics):
    """Drop wall-clock figures, which differ between any two runs."""
    return [{k: v for k, v in m.items()
             if not k.startswith(("timing_s/", "perf/")) and "_s" not in k.split("/")[-1]
             and "tokens_per_s" not in k}
            for m in metrics]


def test_two_runs_with_one_seed_give_identical_metrics(tmp_path):
    _, first = train("grpo", tmp_path / "a", "trainer.steps=3", *FAST)
    _, second = train("grpo", tmp_path / "b", "trainer.steps=3", *FAST)
    assert len(first) == 3
    assert _stable(first) == _stable(second)


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    _, whole = train("grpo", tmp_path / "whole", "trainer.steps=4", *FAST)
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *FAST)
    _, resumed = train("grpo", tmp_path / "part", "trainer.steps=4", *FAST,
                       resume=trainer.run.path)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]  # appended to the same file
    assert _stable(resumed) == _stable(whole)
