"""`trainer.balance_batch` on Ray with the actor on two data-parallel ranks: the
reordered rows train as the original ones do, and each rank's share of the tokens
evens out. The loss is a mean over sequences, and both orders give each rank the
same number of them, so any misaligned row (an advantage paired with another
sample) would change the gradient."""
import pytest

from tests.support.e2e import train

pytestmark = [pytest.mark.ray, pytest.mark.slow,  # two Ray training runs (~40 s)
              pytest.mark.usefixtures("ray_session")]

ARGS = ("runtime.name=ray", "runtime.torch_threads=1", "trainer.steps=2",
        "trainer.val_every=0", "data.batch_size=8", "rollout.n=4",
        "actor.mini_batch_size=32", "actor.micro_batch_size=16",
        "placement.pools.main.devices_per_node=2", "actor.loss_agg_mode=seq-mean-token-mean")


def test_balanced_rows_train_like_the_original_order_on_two_ranks(tmp_path):
    _, plain = train("grpo", tmp_path / "plain", *ARGS)
    _, balanced = train("grpo", tmp_path / "balanced", *ARGS, "trainer.balance_batch=true")
    for a, b in zip(plain, balanced):
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm",
                    "response_length/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert b["balance/token_spread_after"] <= b["balance/token_spread_before"]
    assert any(m["balance/token_spread_after"] < m["balance/token_spread_before"]
               for m in balanced)  # rows did move
