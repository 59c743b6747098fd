"""One module answers "local shard / whole tensor / is sharded" for DTensors
(core/dtensor.py): a plain tensor passes through; a DTensor sharded over a one-rank
gloo mesh gives its local shard and, gathered, its whole value."""
from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from hybridflow.core.dtensor import is_sharded, local_shard, whole_tensor


def test_a_plain_tensor_is_not_sharded_and_is_its_own_shard_and_whole():
    t = torch.arange(6.0)
    assert not is_sharded(t)
    assert local_shard(t) is t and whole_tensor(t) is t
    assert not is_sharded(None) and local_shard(3) == 3  # anything else: as it is


@pytest.fixture
def one_rank_group(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_dtensor_is_sharded_with_a_local_shard_and_a_whole_value(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    value = torch.arange(8.0).reshape(4, 2)
    d = distribute_tensor(value, init_device_mesh("cpu", (1,)), [Shard(0)])
    assert is_sharded(d)
    local = local_shard(d)
    assert not is_sharded(local) and torch.equal(local, value)  # one rank: all of it
    whole = whole_tensor(d)
    assert not is_sharded(whole) and torch.equal(whole, value)
