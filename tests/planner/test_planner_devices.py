"""Device table and cluster shape."""
import pytest

from hybridflow.planner import DEVICES, Cluster, get_device


def test_table_has_the_required_devices():
    assert {"a100-80g", "h100-80g", "h200-141g", "cpu"} <= set(DEVICES)
    assert get_device("h200").memory_bytes > get_device("h100").memory_bytes
    assert get_device("h100").bf16_flops > get_device("a100").bf16_flops


def test_unknown_device_names_the_known_ones():
    with pytest.raises(ValueError, match="known devices"):
        get_device("tpu-v5")


def test_cluster_counts_devices_and_rejects_empty_shapes():
    assert Cluster(4, 8, "h100").devices == 32
    with pytest.raises(ValueError, match="at least one node"):
        Cluster(0, 8, "a100-80g")
