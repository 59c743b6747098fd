"""A CPU pool's capacity is this machine's memory, and `hybridflow run` refuses a CPU
run whose predicted peak does not fit it, naming the pass and the keys to change."""
import psutil
import pytest

from hybridflow.cli import main
from hybridflow.memory import report
from hybridflow.memory.report import launch_memory_problems, pass_keys, plan_memory
from hybridflow.program.assemble import prepare

GRPO = "graphs/grpo.py"


def test_a_cpu_pool_has_the_memory_this_machine_has():
    loaded = prepare(GRPO, [], preflight=False)
    got = plan_memory(loaded.cfg, loaded.plan)
    assert got.device == "cpu"
    assert got.capacity == psutil.virtual_memory().total
    assert got.fits  # the toy run fits any machine that runs the tests


def test_a_gpu_device_keeps_its_own_memory():
    loaded = prepare(GRPO, ["placement.cluster.device=h100-80g"], preflight=False)
    from hybridflow.planner.devices import get_device
    got = plan_memory(loaded.cfg, loaded.plan).capacity
    assert got == get_device("h100-80g").memory_bytes
    assert launch_memory_problems(loaded.cfg, loaded.plan) == []  # not this machine's RAM


@pytest.mark.parametrize("name, keys", [
    ("actor.update", ["actor.micro_batch_size", "actor.max_tokens_per_micro_batch"]),
    ("actor.logprob", ["rollout.log_prob_micro_batch_size",
                       "rollout.log_prob_max_tokens_per_micro_batch"]),
    ("ref.logprob", ["ref.micro_batch_size", "ref.max_tokens_per_micro_batch"]),
    ("rollout.generate", ["rollout.micro_batch_size"]),
])
def test_each_pass_names_the_keys_that_size_it(name, keys):
    named = " ".join(pass_keys(name))
    assert all(key in named for key in keys)


def test_run_refuses_a_cpu_run_that_does_not_fit_before_anything_starts(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setattr(report, "machine_memory_bytes", lambda: 2 ** 20)
    runs = tmp_path / "runs"
    assert main(["run", GRPO, f"trainer.runs_dir={runs}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "does not fit: pool 'main'" in err and "peak in actor." in err
    assert "micro_batch_size" in err and "token budget" in err
    assert "trainer.check_memory=false" in err
    assert not runs.exists()  # refused before a run directory was made
    loaded = prepare(GRPO, ["trainer.check_memory=false"], preflight=False)
    assert loaded.cfg.trainer.check_memory is False


def test_a_cpu_entry_calibrated_here_has_this_machines_memory(tmp_path, monkeypatch):
    """An entry calibrated from a CPU run (`plan --calibrate RUN --device cpu --save`),
    also one saved before entries said they were a CPU (no `cpu` key, 256 GiB copied
    from the generic entry): a run placed on it is sized and refused by this
    machine's memory, as one on `cpu` is."""
    import json
    from dataclasses import asdict

    from hybridflow.planner.devices import get_device
    monkeypatch.setenv("HYBRIDFLOW_DEVICES_DIR", str(tmp_path))
    entry = asdict(get_device("cpu"))
    entry.update(name="fitted-here", label="CPU, calibrated",
                 efficiency=get_device("cpu").efficiency.to_json(),
                 provenance={"calibrated_from": "runs/x", "start_device": "cpu"})
    del entry["cpu"]  # as saved before the flag
    (tmp_path / "fitted-here.json").write_text(json.dumps(entry))
    assert get_device("fitted-here").cpu
    loaded = prepare(GRPO, ["placement.cluster.device=fitted-here"], preflight=False)
    got = plan_memory(loaded.cfg, loaded.plan)
    assert got.cpu and got.capacity == psutil.virtual_memory().total
    monkeypatch.setattr(report, "machine_memory_bytes", lambda: 2 ** 20)
    assert launch_memory_problems(loaded.cfg, loaded.plan)  # refused, as on `cpu`
