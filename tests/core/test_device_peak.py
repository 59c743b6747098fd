"""core/device_peak.py: the measured matmul peak a node's perf/mfu is read against."""


def test_measuring_the_peak_leaves_the_global_rng_alone():
    """The peak is measured once per process, in the middle of a run: drawing its
    matrices from the global RNG shifted every later sample of a seeded run (two runs in
    one process then differed from step 2)."""
    import torch
    from hybridflow.core.device_peak import matmul_flops
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    matmul_flops(size=16, repeats=1, per_repeat=1)
    assert torch.equal(torch.rand(3), expected)
