"""Sequence parallelism end to end on the Ray runtime, on the CPU: GRPO with the actor
and the reference at `placement.parallel.<role>.sp=2` on a pool of two ranks (one sp
group, gloo) runs and learns; every model node runs, the old log-probs equal the
rollout's own (finite, to float32 rounding), and the first steps equal the same seed's
run at sp=1 (dp 2 over the same two ranks): generation ignores sp, so both runs
generate the same rows on the same ranks, and an sp group's forward gives each row's
log-probs as one rank does. One optimizer step per batch (a mini-batch of the whole
batch), so both layouts train on the same rows; the old log-probs' pass is kept so it
runs at sp=2.

Four runs serve both tests (a module fixture): the whole run at sp=2 (12 steps), and
a chain that starts at sp=1 (2 steps, checkpointed each), resumes at sp=2 (step 3) and
then at sp=1 again (step 4). The chain's first two steps are a plain sp=1 run's (the
same seed and rows; validation draws nothing the training uses): they are the sp=1
baseline the sp=2 run is held to."""
import math

import pytest

from tests.support.e2e import series, train

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

TWO_RANKS = ("runtime.name=ray", "placement.pools.main.devices_per_node=2",
             "runtime.torch_threads=1", "trainer.seed=7", "actor.mini_batch_size=128",
             "trainer.keep_unneeded_passes=true")
SP2 = ("placement.parallel.actor.sp=2", "placement.parallel.ref.sp=2")
MODEL_NODES = ("rollout.generate", "actor.logprob", "ref.logprob", "actor.update")
LEARN = ("trainer.steps=12", "trainer.val_every=12", "trainer.val_samples=1")
PART = ("trainer.save_every=1", "trainer.val_every=0")
# sp=2 against sp=1: the same rows and weights; the sums over a row's positions and the
# reductions over ranks in another order (float32). Measured: entropy 5e-9 apart,
# grad_norm 2.4e-7 (of 2.55), the second step's KL loss (reference at sp=2) 2e-9.
ATOL = 1e-6
GRAD_NORM_RTOL = 1e-5
ROLLOUT_LOGPROB_ATOL = 1e-5  # old log-probs against the sampler's: 6e-7 at sp=1 and 2
RESUME_ATOL = 1e-5  # steps after a resume at another sp size: reductions in two orders
VAL = "val/toy_arith/greedy"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    trainer, whole = train("grpo", root / "whole", *TWO_RANKS, *SP2, *LEARN)
    first, _ = train("grpo", root / "part", *TWO_RANKS, *PART, "trainer.steps=2")
    path = first.run.path
    train("grpo", root / "part", *TWO_RANKS, *PART, *SP2, "trainer.steps=3", resume=path)
    _, chain = train("grpo", root / "part", *TWO_RANKS, *PART, "trainer.steps=4",
                     resume=path)
    trained = {m["step"]: m for m in whole if "actor/pg_loss" in m}  # not the val lines
    return trainer, whole, trained, chain


def test_grpo_with_an_sp2_actor_and_reference_runs_like_sp1(runs):
    trainer, whole, trained, chain = runs
    assert trainer.run.status()["state"] == "finished"
    ran = {k.removeprefix("timing_s/") for k in whole[-1] if k.startswith("timing_s/")}
    assert set(MODEL_NODES) <= ran, sorted(ran)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert all(math.isfinite(v) for v in series(whole, key)), (key, whole)
    diffs = series(whole, "rollout/probs_diff_max")  # exp(old log-prob) vs the rollout's
    assert len(diffs) == 12 and all(d < ROLLOUT_LOGPROB_ATOL for d in diffs), diffs

    first, base = trained[1], chain[0]  # step 1 at sp=2 and at sp=1
    assert first["critic/score/mean"] == base["critic/score/mean"]  # the same rollouts
    for key in ("actor/pg_loss", "actor/entropy"):
        assert first[key] == pytest.approx(base[key], abs=ATOL), key
    assert first["actor/grad_norm"] == pytest.approx(base["actor/grad_norm"],
                                                     rel=GRAD_NORM_RTOL)
    # step 2: the reference's log-probs at sp=2 against the updated actor's
    assert trained[2]["actor/kl_loss"] > 0
    assert trained[2]["actor/kl_loss"] == pytest.approx(chain[1]["actor/kl_loss"], abs=ATOL)


def test_grpo_at_sp2_learns_and_resumes_across_sp_sizes(runs):
    """The actor and reference at sp=2 learn the toy (held-out greedy accuracy rises as
    the dp=2 runs' does), and a run resumed with `run --resume` at another sp size, first
    sp=1 -> sp=2 then back to sp=1, gives the whole sp=2 run's steps: the checkpoint
    (DCP) replicates over sp, so any sp size reads it."""
    _, whole, trained, chain = runs
    accuracy = series(whole, VAL)
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
    assert accuracy[-1] >= 0.9, accuracy  # issue 38's bar: held-out greedy >= 0.9 at sp=2
    assert [m["step"] for m in chain] == [1, 2, 3, 4]
    for step, a in enumerate(chain, start=1):
        b = trained[step]
        assert a["critic/score/mean"] == b["critic/score/mean"], step  # the same rollouts
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):
            assert a[key] == pytest.approx(b[key], abs=RESUME_ATOL), (step, key)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4), step
