"""The runtime is built by the factory registered for `runtime.name`
(hybridflow/runtime/factories.py), not by a switch on the name."""
from __future__ import annotations

import pytest

from tests.support import runtime_fakes as fakes
from hybridflow.core.modes import RuntimeName
from hybridflow.runtime import factories
from hybridflow.runtime.factories import make_runtime, register_runtime, runtime_factory
from hybridflow.runtime.local import LocalRuntime


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(factories, "_FACTORIES", dict(factories._FACTORIES))
    return factories._FACTORIES


def test_every_runtime_name_has_a_factory():
    assert all(callable(runtime_factory(name)) for name in RuntimeName)


def test_the_configured_name_picks_the_factory(registry):
    plan = fakes.local_ppo_plan()
    runtime = make_runtime(plan, {"runtime": {"name": "local", "torch_threads": 1}}, seed=3)
    assert isinstance(runtime, LocalRuntime) and runtime.plan is plan
    built = []
    register_runtime(RuntimeName.RAY, lambda *args: built.append(args) or "ray runtime",
                     replace=True)
    cfg = {"runtime": {"name": "ray"}}
    assert make_runtime(plan, cfg, 5, [plan]) == "ray runtime"
    assert built == [(plan, cfg, 5, (plan,))]


def test_registration_errors_name_what_to_do(registry):
    with pytest.raises(ValueError, match="runtime 'local' already has a factory; pass "
                       "replace=True"):
        register_runtime(RuntimeName.LOCAL, print)
    with pytest.raises(TypeError, match=r"must be a RuntimeName member \(local, ray\), "
                       "not 'slurm'"):
        register_runtime("slurm", print)
    del registry[RuntimeName.RAY]
    with pytest.raises(ValueError, match=r"runtime.name='ray' has no runtime factory "
                       r"\(registered: local\); register one with"):
        make_runtime(None, {"runtime": {"name": "ray"}})
