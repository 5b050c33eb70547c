"""A run's identity (rlstab.lab.spec): regime fields added later do not strand folders written before them."""

import json

from rlstab.lab.regimes import load_regime
from rlstab.lab.spec import LATER_FIELDS, SPEC_FILE, RunSpec, mismatch, write_spec
from rlstab.loading import load

from quick_regimes import QUICK


def spec(**regime):
    o = load("grpo")
    return RunSpec("grpo", o.to_yaml(), o.fingerprint(), load_regime({**QUICK, **regime}), "add2", "tiny", 0, 5)


def test_a_folder_written_before_the_later_fields_still_resumes(tmp_path):
    write_spec(spec(), tmp_path)
    saved = json.loads((tmp_path / SPEC_FILE).read_text())
    for name in LATER_FIELDS:  # as a spec.json from before these fields existed
        saved["regime"].pop(name, None)
    (tmp_path / SPEC_FILE).write_text(json.dumps(saved))
    assert mismatch(spec(), tmp_path) is None
    assert "another regime" in mismatch(spec(pass_k=4), tmp_path)  # a later field away from its default counts
    assert "another regime" in mismatch(spec(instruments=True), tmp_path)


def test_the_later_fields_defaults_are_the_regimes():
    regime = load_regime({"name": "plain"})
    assert {name: getattr(regime, name) for name in LATER_FIELDS} == LATER_FIELDS
