"""In a real Ray worker started with the launcher's runtime_env, OpenRLHF's trainer module builds the rlstab loss.

The driver here does what the launcher does to OpenRLHF's ``ray.init`` call (wraps it with
``with_rlstab_runtime_env``), starts a one-CPU local Ray cluster, and asks a remote task — a
fresh worker process, where nothing the driver patched exists — to import OpenRLHF 0.11.2's real
``ppo_actor`` and build its ``PolicyLoss`` as ``ActorPPOTrainer`` does.
"""

import json
import subprocess
import sys

from openrlhf_gpu_stubs import subprocess_env, write_stubs

DRIVER = """
import json, sys, ray
from rlstab.adapters.openrlhf.launcher import with_rlstab_runtime_env
from rlstab.adapters.openrlhf.config import build_objective, objective_to_env

ray.init = with_rlstab_runtime_env(ray.init, objective_to_env(build_objective("stapo")))
ray.init(num_cpus=1, include_dashboard=False, object_store_memory=100 * 1024**2,
         runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})

@ray.remote
def probe():
    import os
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    from openrlhf.models import Actor
    loss = ppo_actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0)
    return {"pid": os.getpid(), "class": type(loss).__name__, "objective": loss.objective.name,
            "forward_wrapped": getattr(Actor.forward, "__rlstab_wrapped__", False),
            "openrlhf_env": os.environ.get("TOKENIZERS_PARALLELISM")}

result = ray.get(probe.remote())
import os
result["driver_pid"] = os.getpid()
result["driver_imported_ppo_actor"] = "openrlhf.trainer.ray.ppo_actor" in sys.modules
print("RESULT " + json.dumps(result))
ray.shutdown()
"""


def test_ray_worker_builds_the_rlstab_loss(tmp_path):
    env = subprocess_env(write_stubs(tmp_path / "stubs"), RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run([sys.executable, "-c", DRIVER], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["pid"] != result["driver_pid"] and not result["driver_imported_ppo_actor"]
    assert result["class"] == "RlstabPolicyLoss" and result["objective"] == "stapo"
    assert result["forward_wrapped"]  # stapo reads entropy
    assert result["openrlhf_env"] == "true"  # the caller's own runtime_env entries are kept
