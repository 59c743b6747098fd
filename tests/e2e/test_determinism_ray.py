"""On Ray too: one seed gives one run, and a resumed run (same runtime, same placement)
continues exactly where it stopped — worker generators are seeded per rank and saved."""
import pytest

from tests.support.e2e import train
from tests.support.runs import FAST, stable

pytestmark = [pytest.mark.ray, pytest.mark.slow,  # three training runs on Ray (~35 s)
              pytest.mark.usefixtures("ray_session")]

RAY = (*FAST, "runtime.name=ray", "placement.pools.main.devices_per_node=2")


def _no_runtime_timings(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("runtime/")} for m in stable(metrics)]


def test_ray_runs_are_reproducible_and_resume_exactly(tmp_path):
    _, whole = train("grpo", tmp_path / "whole", "trainer.steps=4", *RAY)
    _, again = train("grpo", tmp_path / "again", "trainer.steps=4", *RAY)
    assert _no_runtime_timings(whole) == _no_runtime_timings(again)
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *RAY)
    _, resumed = train("grpo", tmp_path / "part", "trainer.steps=4", *RAY,
                       resume=trainer.run.path)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert _no_runtime_timings(resumed) == _no_runtime_timings(whole)
