"""The local runtime's torch threads: by default the cores this process may use (its
affinity mask), `runtime.torch_threads` when set."""
import os

import torch

from hybridflow.core.runtime_section import RuntimeConfig
from hybridflow.runtime.local import available_cores
from tests.support.e2e import train

ONE_STEP = ("trainer.steps=1", "trainer.val_every=0", "data.batch_size=4", "rollout.n=2",
            "actor.mini_batch_size=8")


def test_available_cores_is_the_affinity_mask():
    assert available_cores() == len(os.sched_getaffinity(0))
    assert RuntimeConfig().torch_threads is None


def test_a_local_run_uses_the_available_cores_unless_told(tmp_path):
    before = torch.get_num_threads()
    try:
        train("grpo", tmp_path, *ONE_STEP)
        assert torch.get_num_threads() == available_cores()
        train("grpo", tmp_path, *ONE_STEP, "runtime.torch_threads=1")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
