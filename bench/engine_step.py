"""One training step of the engine through its real loop, for benchmarks that time it
step by step against something else (bench/scale.py, bench/real_model_trl.py)."""
from __future__ import annotations

import os
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GRPO = os.path.join(ROOT, "graphs", "grpo.py")

__all__ = ["EngineStep", "GRPO"]


class EngineStep:
    """A graph file's run (`hybridflow.run.loop.Trainer`, the runtime the config names)
    under `overrides` (and a `--config` YAML file); `step()` runs one `train_step`."""

    def __init__(self, overrides: list[str], rows: int, yaml_file: str | None = None,
                 graph: str = GRPO):
        from hybridflow.program.assemble import prepare
        from hybridflow.run.loop import Trainer
        from hybridflow.run.tracking import RunDir
        loaded = prepare(graph, overrides, yaml_file=yaml_file)
        self.trainer = Trainer(loaded, RunDir(tempfile.mkdtemp(prefix="bench-engine-")))
        self.rows = rows
        self._steps = 0

    @property
    def generate_calls(self) -> int:
        """Generate calls so far: the seed of the next step's drawn lengths."""
        return self._steps  # one generate call a step

    def step(self) -> dict:
        """Time per node (`timing_s/...` metrics), tokens generated, and every metric."""
        self._steps += 1
        metrics = self.trainer.train_step()
        phases = {k.split("/", 1)[1]: v for k, v in metrics.items()
                  if k.startswith("timing_s/")}
        generated = metrics.get("response_length/mean", 0.0) * self.rows
        return {"phases_s": phases, "generated_tokens": generated, "metrics": metrics}

    def close(self) -> None:
        self.trainer.close()
