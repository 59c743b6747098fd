"""Device entries and calibration: a synthetic timeline gives back the constants it was made
with, and `hybridflow plan --calibrate` writes an entry that `--device` reads."""
import dataclasses
import json
import os

import pytest
from planner_graphs import grpo_graph

from hybridflow.cli import main
from hybridflow.planner import Cluster, ModelSpec, Workload, get_device
from hybridflow.planner.calibrate import calibrate, predict_run
from hybridflow.planner.device_store import load_device, save_device
from hybridflow.program.run_dir import MeasuredRun, node_means

TINY = ModelSpec("tiny", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=80)
WORK = Workload(prompts=16, samples_per_prompt=8, prompt_len=8, response_len=4,
                mini_batches=2, micro_batch_tokens=768, response_mean=3.4, padded_len=12)
TRUE = dict(mfu_forward=0.004, decode_step_overhead_s=0.03, mfu_train=0.01,
            node_call_overhead_s=0.006, step_overhead_s=0.02, rule_seconds_per_sequence=1e-4)


@pytest.fixture
def devices_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_DEVICES_DIR", str(tmp_path / "devices"))
    return tmp_path / "devices"


def synthetic_run(device) -> MeasuredRun:
    """A run whose node times are the model's own predictions on `device`."""
    models = {"actor": TINY, "ref": TINY}
    run = MeasuredRun("synthetic", grpo_graph(), models, WORK, 1, (("actor", "ref"),), {}, 0.0,
                      (2, 3))
    predicted = predict_run(run, device)
    return dataclasses.replace(run, node_seconds=dict(predicted.node_seconds),
                               step_seconds=predicted.step_seconds)


def test_calibration_recovers_the_constants_a_synthetic_timeline_was_made_with():
    cpu = get_device("cpu")
    truth = dataclasses.replace(cpu, efficiency=dataclasses.replace(cpu.efficiency, **TRUE))
    fitted = calibrate(synthetic_run(truth), cpu)
    for name, value in TRUE.items():
        assert getattr(fitted.efficiency, name) == pytest.approx(value, rel=0.02), name
    assert calibrate(synthetic_run(truth), cpu).efficiency.mfu_decode == cpu.efficiency.mfu_decode


def test_timeline_medians_keep_the_steps_asked_sum_repeated_nodes_and_ignore_a_stall():
    timeline = [{"step": 1, "node": "a", "start": 0, "end": 50},  # warm-up, not asked for
                {"step": 2, "node": "a", "start": 0, "end": 1},
                {"step": 2, "node": "a", "start": 2, "end": 3},  # twice in a step: 2 s
                {"step": 3, "node": "a", "start": 0, "end": 3},
                {"step": 4, "node": "a", "start": 0, "end": 40}]  # a stalled step
    assert node_means(timeline, (2, 3, 4)) == {"a": 3.0}
    ranks = [{"step": 2, "node": "b", "rank": 0, "start": 0, "end": 1},
             {"step": 2, "node": "b", "rank": 1, "start": 0, "end": 3}]
    assert node_means(ranks, (2,)) == {"b": 3.0}  # Ray: the slowest rank


def test_device_entries_round_trip_and_are_found_by_name(devices_dir):
    entry = dataclasses.replace(get_device("cpu"), name="box", label="my box")
    path = save_device(entry, "box", {"how": "test"})
    assert path == str(devices_dir / "box.json")
    assert load_device(path) == entry
    assert get_device("box") == entry
    assert Cluster(1, 1, "box").spec.label == "my box"
    assert get_device(path) == entry  # a path works too
    with pytest.raises(ValueError, match="known devices: .*box"):
        get_device("nope")


def test_a_device_entry_with_an_unknown_constant_is_an_actionable_error(devices_dir):
    os.makedirs(devices_dir)
    data = json.loads(json.dumps(dataclasses.asdict(get_device("cpu"))))
    data["efficiency"]["mfu_trian"] = 0.3
    (devices_dir / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown efficiency constant.*mfu_trian"):
        get_device("bad")


def write_run_dir(folder, run: MeasuredRun) -> str:
    """A run directory as `hybridflow run` writes it, with the synthetic node times."""
    from tests.support.recorded_runs import graph_path, record_run
    record_run(folder, graph_path("grpo.py"), "trainer: {steps: 3, val_every: 0}\n")
    lines, metrics = [], []
    for step in (1, 2, 3):
        clock = 0.0
        for node, seconds in run.node_seconds.items():
            lines.append({"step": step, "node": node, "start": clock, "end": clock + seconds})
            clock += seconds
        metrics.append({"step": step, "response_length/mean": 3.4,
                        "perf/time_per_step": run.step_seconds})
    (folder / "timeline.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in metrics) + "\n")
    return str(folder)


def test_plan_calibrate_saves_an_entry_that_predicts_the_run(tmp_path, devices_dir, capsys):
    from hybridflow.program.run_dir import read_run
    folder = tmp_path / "run"
    write_run_dir(folder, dataclasses.replace(synthetic_run(get_device("cpu")), node_seconds={
        "rollout.generate": 0.2, "actor.logprob": 0.1, "reward.score": 0.005,
        "grpo_advantages": 0.005, "ref.logprob": 0.1, "actor.update": 0.3}, step_seconds=0.75))
    assert main(["plan", "--calibrate", str(folder), "--device", "cpu", "--save", "fit"]) == 0
    assert "rollout.generate" in capsys.readouterr().err
    run = read_run(str(folder))
    assert run.workload.response_mean == pytest.approx(3.4)
    prediction = predict_run(run, get_device("fit"))
    for node in ("rollout.generate", "actor.update"):
        assert prediction.node_seconds[node] == pytest.approx(run.node_seconds[node], rel=0.02)
    assert prediction.step_seconds == pytest.approx(0.75, rel=0.02)
    provenance = json.loads((devices_dir / "fit.json").read_text())["provenance"]
    assert provenance["calibrated_from"] == str(folder)
    from hybridflow.planner.measure import host_memory_bytes
    fit = get_device("fit")  # fitted on this machine: a CPU with this machine's memory
    assert fit.cpu and fit.memory_bytes == host_memory_bytes()


def test_plan_calibrate_on_a_folder_that_is_no_run_says_so(tmp_path, capsys):
    assert main(["plan", "--calibrate", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "graph.json does not exist" in err and "run directory" in err


def test_plan_from_config_predicts_the_embedded_default_run(capsys):
    """`--from-config` plans the run `hybridflow run graphs/grpo.py` would start: its tiny
    model, 16 prompts x 8 samples, everything in one local process."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    graph = os.path.join(repo, "graphs", "grpo.py")
    assert main(["plan", graph, "--from-config", "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["prompts"] == 16 and data["workload"]["samples_per_prompt"] == 8
    assert data["models"]["actor"]["params"] < 1e6  # the embedded toy model
    assert data["best"]["label"] == "actor+ref[1: actor 1x1 ref 1x1]"
    assert data["best"]["nodes"]["rollout.generate"]["seconds"] > 0
