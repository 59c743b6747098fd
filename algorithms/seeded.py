"""`SeededDraws`: a function node that draws from its own `random.Random` (`self.rng`)
and keeps the generator's state across steps, so the loop checkpoints it and a
resumed run draws what an uninterrupted one would (see `Trainer.stateful_nodes`)."""
from __future__ import annotations

__all__ = ["SeededDraws"]


class SeededDraws:
    rng: "random.Random"  # noqa: F821 - set by the subclass

    def state_dict(self) -> dict:
        """Where the draws are (JSON-safe: the generator's state as lists)."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
