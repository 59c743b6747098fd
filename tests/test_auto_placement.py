"""placement=auto: the planner's best placement becomes the run's placement."""
import os

from hybridflow.program import prepare

PPO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "graphs", "ppo.py")


def test_auto_placement_replaces_the_placement_section(capsys):
    loaded = prepare(PPO, ["placement=auto", "placement.cluster.devices_per_node=4",
                           "runtime.name=ray"], preflight=False)
    placement = loaded.plan.placement
    assert sum(p.world_size for p in placement.pools.values()) == 4
    assert {"actor", "ref", "critic", "reward"} <= set(placement.roles)
    assert loaded.cfg.placement.auto is False  # the saved config replays the choice
    assert set(loaded.cfg.placement.pools) == set(placement.pools)
    assert "Best plan" in capsys.readouterr().out


def test_auto_placement_on_one_device_colocates_everything(capsys):
    loaded = prepare(PPO, ["placement=auto"], preflight=False)
    assert len(loaded.plan.placement.pools) == 1
