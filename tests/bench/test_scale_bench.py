"""bench/scale.py runs end to end at the tiniest settings and writes its JSON with the
fields docs/benchmarks.md reads; speed is not asserted."""
from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

@pytest.fixture(autouse=True)
def engine_registry():
    """scale.py names its engine by import path, which registers it process-wide:
    put the registry back, so later tests see only the built-in engines."""
    from hybridflow.workers.rollout import engine
    saved = dict(engine._ENGINES)
    yield
    engine._ENGINES.clear()
    engine._ENGINES.update(saved)


TINY = {"size": "5m", "prompts": 2, "n": 2, "max_response": 24, "micro": 2, "threads": 1,
        "budget_tokens": 2 * (64 + 24)}


def test_scale_writes_every_variant_with_tokens_phases_and_ratios(tmp_path):
    from bench import scale
    out = tmp_path / "scale.json"
    scale.run(dict(TINY), reps=1, warmup=0, with_memory=False, out=str(out), quiet=True)
    payload = json.loads(out.read_text())
    assert payload["machine"]["torch_threads"] == 1
    assert set(payload["variants"]) == set(scale.VARIANTS)
    for name, variant in payload["variants"].items():
        assert variant["step_s"] > 0 and variant["tokens_per_s"] > 0
        assert 0.0 <= variant["update_padding_fraction"] < 1.0
        assert "actor.update" in variant["phases_s"], name  # time split by node
    assert payload["variants"]["engine-packed"]["update_padding_fraction"] == 0.0
    assert payload["tokens"]["generated"] > 0
    assert payload["tokens"]["trained"] <= payload["tokens"]["padded_cells"]
    targets = payload["targets"]
    for key in ("engine_over_handwritten", "packed_over_padded", "verdict"):
        assert key in targets
    assert "tokens/s" in scale.report(payload)


def test_scale_memory_probe_reports_a_peak():
    from bench import scale
    result = scale.probe("handwritten", dict(TINY))
    assert result["variant"] == "handwritten" and result["peak_rss"] > 0


def test_scale_with_trl_adds_its_step_and_ratios(tmp_path):
    import pytest
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from bench import scale
    payload = scale.run(dict(TINY), reps=1, warmup=0, with_memory=False,
                        out=str(tmp_path / "scale.json"), quiet=True, with_trl=True)
    assert payload["trl"]["trl_step_s"] > 0
    assert "engine_padded_over_trl" in payload["targets"]
