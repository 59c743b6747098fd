"""Metric sinks: metrics.jsonl always; W&B offline through its public API."""
import json
import os
import sys
import types

import pytest

from hybridflow.tracking import MetricSinks, RunDir


def test_wandb_sink_logs_offline_with_the_step(tmp_path, monkeypatch):
    calls = {}
    fake = types.ModuleType("wandb")
    def log(data, step):
        calls.setdefault("log", []).append((data, step))

    run = types.SimpleNamespace(log=log, finish=lambda: calls.setdefault("finished", True))
    fake.init = lambda **kw: calls.setdefault("init", kw) and run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sinks = MetricSinks(RunDir(str(tmp_path)), wandb=True, name="r")
    sinks.log(3, {"actor/pg_loss": 0.5, "note": "text"})
    sinks.close()
    assert os.environ["WANDB_MODE"] == "offline"
    assert calls["init"]["dir"] == str(tmp_path)
    assert calls["log"] == [({"actor/pg_loss": 0.5}, 3)]
    assert calls["finished"]
    line = json.loads(open(tmp_path / "metrics.jsonl").read())
    assert line == {"step": 3, "actor/pg_loss": 0.5, "note": "text"}


def test_missing_tracking_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(RuntimeError, match=r"trainer.wandb=true needs the 'wandb' package"):
        MetricSinks(RunDir(str(tmp_path)), wandb=True)
