"""What determinism tests on both runtimes share: small-run overrides and the metrics
that two runs of one seed must agree on."""
from __future__ import annotations

FAST = ("trainer.val_every=0", "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
        "actor.micro_batch_size=32")


def stable(metrics: list[dict]) -> list[dict]:
    """Drop wall-clock figures, which differ between any two runs."""
    return [{k: v for k, v in m.items()
             if not k.startswith(("timing_s/", "perf/")) and "_s" not in k.split("/")[-1]
             and "tokens_per_s" not in k}
            for m in metrics]
