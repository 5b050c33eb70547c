"""The lab's Ray backend on a real local Ray cluster (the ``ray`` extra's environment, scripts/test.sh).

Each run is a Ray task; the per-run metrics must equal those of the same grid run in this process.
"""

import json

import pytest
import ray

from rlstab.lab import compare
from rlstab.lab.checkpoint import read_rows

from quick_regimes import QUICK_LAG, without_time

GRID = {"seeds": 2, "steps": 3, "regimes": [QUICK_LAG], "progress": False}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_tasks_give_the_runs_of_a_local_process(cluster, tmp_path):
    cache = tmp_path / "cache"
    local = compare(["grpo", "tis"], out=tmp_path / "local", workers=1, cache_dir=cache, **GRID)
    remote = compare(["grpo", "tis"], out=tmp_path / "ray", ray_address="auto", cache_dir=cache, **GRID)
    for run in local["runs"]:
        assert without_time(read_rows(tmp_path / "ray" / run["folder"])) == without_time(read_rows(tmp_path / "local" / run["folder"]))
    strip = [{**r, "summary": {k: v for k, v in r["summary"].items() if k != "wall_time"}} for r in remote["runs"]]
    assert strip == [{**r, "summary": {k: v for k, v in r["summary"].items() if k != "wall_time"}} for r in local["runs"]]
    assert json.loads((tmp_path / "ray" / "results.json").read_text())["paired"] == remote["paired"]


def test_a_ray_rerun_trains_nothing(cluster, tmp_path):
    first = compare(["grpo"], out=tmp_path, ray_address="auto", cache_dir=tmp_path / "cache", **GRID)
    again = compare(["grpo"], out=tmp_path, ray_address="auto", cache_dir=tmp_path / "cache", **GRID)
    assert again == first
