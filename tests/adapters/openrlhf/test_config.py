"""The OpenRLHF config checks: the launcher's validation of an objective, in the driver, imports no torch.

``python -m rlstab.adapters.openrlhf`` checks the objective before Ray or OpenRLHF starts (see
test_launcher.py), so a bad YAML fails in seconds. The checks read the objective's plan, not its
compiled loss; each case runs in a fresh interpreter, as this test process imported torch long since.
"""

import json
import subprocess
import sys

CHECK_EVERY_PRESET = """
import json, sys
import rlstab
from rlstab.errors import ConfigError
from rlstab.adapters.openrlhf.config import build_objective, check_supported, objective_from_env, objective_to_env
from rlstab.adapters.openrlhf.hook import install

accepted, refused = [], []
for name in rlstab.preset_names():
    try:
        objective = build_objective(name)
    except ConfigError:
        refused.append(name)
        continue
    check_supported(objective)
    objective_from_env({"RLSTAB_OPENRLHF_OBJECTIVE": objective_to_env(objective)})
    accepted.append(name)
install("stapo", step_statistics="local")  # what the launcher and every Ray worker run first
print(json.dumps({"accepted": accepted, "refused": refused,
                  "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


def test_config_checks_import_no_torch():
    result = subprocess.run([sys.executable, "-c", CHECK_EVERY_PRESET], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "stapo" in report["accepted"] and "four_layers" in report["refused"]  # both outcomes ran
    assert report["torch"] == [], "an OpenRLHF config check imported torch"
