"""Shared test settings: few torch threads (2-core machines), and paths."""
import os

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAPHS = os.path.join(REPO, "graphs")

torch.set_num_threads(1)


@pytest.fixture
def graph_path():
    return lambda name: os.path.join(GRAPHS, f"{name}.py")
