"""Plugins from installed distributions: loaded lazily, listed with their origin, refused with one line.

Each test writes distributions to a temporary folder (see ``plugin_dists``) and runs a fresh Python.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlstab.schema import kind_refs

from plugin_dists import RATIO_CAP, make_dist, run_cli, run_python

YAML = "extends: grpo\nmasks:\n- {kind: ratio_cap, cap: 1.5}\n"


@pytest.fixture
def ratio_cap(tmp_path):
    make_dist(tmp_path, "ratio-cap", {"ratio_cap": "ratio_cap_plugin:RatioCap"}, {"ratio_cap_plugin": RATIO_CAP})
    (tmp_path / "objective.yaml").write_text(YAML)
    return tmp_path


def test_a_plugin_kind_works_from_yaml_and_is_loaded_only_when_needed(ratio_cap):
    code = (
        "import sys, torch, rlstab\n"
        "assert 'ratio_cap_plugin' not in sys.modules, 'loaded at import'\n"
        "o = rlstab.load(sys.argv[1])\n"
        "assert 'ratio_cap_plugin' in sys.modules\n"
        "print(o.masks[0].describe())\n"
        # r = exp(log 3) = 3 > cap 1.5 on the first token: silenced, zero gradient; r = 1 on the second: kept.
        "logp = torch.tensor([[0.0, -1.0]], requires_grad=True)\n"
        "b = rlstab.TokenBatch(logprobs=logp, old_logprobs=torch.tensor([[-1.0986123, -1.0]]),\n"
        "    advantages=torch.tensor([1.0]), response_mask=torch.ones(1, 2, dtype=torch.bool))\n"
        "out = o.compile()(b); out.loss.backward(); print(logp.grad.abs().tolist(), out.metrics['mask/ratio_cap/silenced'])\n"
    )
    done = run_python(ratio_cap, code, str(ratio_cap / "objective.yaml"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ratio_cap: keep tokens with r <= 1.5"
    # grpo: token-mean over the 2 valid tokens; PPO clip on r = 1, A = 1: d(-A r)/dlogp / 2 = -0.5 on the
    # kept token (magnitudes printed), 0 on the silenced one; one token silenced.
    assert lines[1] == "[[0.0, 0.5]] 1.0"


def test_the_listing_and_the_schema_include_the_plugin_with_its_origin(ratio_cap):
    listing = run_cli(ratio_cap, "components", "--family", "masks")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if " ratio_cap " in line)
    assert row.split()[:4] == ["masks", "ratio_cap", "ratio-cap", "1.0"]
    schema = json.loads(run_cli(ratio_cap, "schema").stdout)
    mapping = kind_refs(schema["properties"]["masks"]["items"])
    assert "ratio_cap" in mapping and "s2t" in mapping
    assert schema["$defs"]["RatioCap"]["properties"]["cap"]["exclusiveMinimum"] == 1.0


def test_a_kind_taken_by_a_built_in_is_refused_naming_both_origins(tmp_path):
    fake_s2t = RATIO_CAP.replace('"ratio_cap"', '"s2t"')
    make_dist(tmp_path, "shadow", {"s2t": "shadow_plugin:RatioCap"}, {"shadow_plugin": fake_s2t})
    done = run_python(tmp_path, "import rlstab; print(type(rlstab.load('stapo').masks[0]).__module__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rlstab.masks.s2t"  # the built-in stays
    (warning,) = [line for line in done.stderr.splitlines() if "PluginWarning" in line]
    assert "plugin 's2t' refused: masks kind 's2t' of shadow_plugin.RatioCap from shadow 1.0" in warning
    assert "is already registered by rlstab.masks.s2t.S2T from rlstab " in warning


def test_two_plugins_with_one_kind_the_second_is_refused(tmp_path):
    make_dist(tmp_path, "first", {"ratio_cap": "first_plugin:RatioCap"}, {"first_plugin": RATIO_CAP})
    make_dist(tmp_path, "second", {"ratio_cap": "second_plugin:RatioCap"}, {"second_plugin": RATIO_CAP})
    listing = run_cli(tmp_path, "components", "--family", "masks")
    assert listing.returncode == 0
    (row,) = [line for line in listing.stdout.splitlines() if " ratio_cap " in line]
    assert row.split()[2] == "first"  # distributions load in name order
    (refused,) = listing.stderr.splitlines()
    assert refused.startswith("refused: plugin 'ratio_cap' refused: masks kind 'ratio_cap' of second_plugin.RatioCap from second 1.0")
    assert "already registered by first_plugin.RatioCap from first 1.0" in refused


def test_a_plugin_that_fails_to_import_is_named_at_load_and_in_the_error(tmp_path):
    make_dist(tmp_path, "broken-plugin", {"ratio_cap": "broken:RatioCap"}, {"broken": "import not_installed_anywhere\n"})
    (tmp_path / "objective.yaml").write_text(YAML)
    done = run_cli(tmp_path, "validate", str(tmp_path / "objective.yaml"))
    assert done.returncode == 1
    failure = (
        "plugin 'ratio_cap' of broken-plugin 1.0 failed to import broken:RatioCap: "
        "ModuleNotFoundError: No module named 'not_installed_anywhere'"
    )
    warning, error = done.stderr.splitlines()
    assert warning == f"warning: {failure}"
    assert [error] == [
        f"{tmp_path / 'objective.yaml'}: masks[0].kind = 'ratio_cap': unknown kind; "
        f"`rlstab components --family masks` lists its 12 kinds ({failure})"
    ]


def test_an_entry_point_that_is_not_a_component_is_refused(tmp_path):
    make_dist(tmp_path, "odd", {"thing": "odd_plugin:Thing"}, {"odd_plugin": "class Thing:\n    pass\n"})
    listing = run_cli(tmp_path, "components")
    assert listing.returncode == 0
    (refused,) = listing.stderr.splitlines()
    assert refused.startswith("refused: plugin 'thing' of odd 1.0: <class 'odd_plugin.Thing'> is not a component class; derive from one of ")


def test_the_ratio_cap_example_works_after_pip_install(tmp_path):
    # The example as a user ships it: a package of its own, installed by pip, used from YAML.
    package = tmp_path / "ratio-cap"
    (package / "ratio_cap").mkdir(parents=True)
    (package / "ratio_cap" / "__init__.py").write_text(RATIO_CAP)
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "ratio-cap"\nversion = "0.3"\ndependencies = ["rlstab"]\n\n'
        '[project.entry-points."rlstab.components"]\nratio_cap = "ratio_cap:RatioCap"\n'
    )
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), str(package)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    (tmp_path / "objective.yaml").write_text(YAML)
    done = run_cli(site, "explain", str(tmp_path / "objective.yaml"))
    assert done.returncode == 0, done.stderr
    assert "        masks[0] ratio_cap: keep tokens with r <= 1.5" in done.stdout.splitlines()
    listing = run_cli(site, "components", "--family", "masks")
    rows = [line.split(None, 2) for line in listing.stdout.splitlines()]
    assert ["masks", "ratio_cap", "ratio-cap 0.3 (entry point ratio_cap = ratio_cap:RatioCap)"] in rows


def test_a_plugin_that_validates_an_objective_while_imported_still_has_its_kind(tmp_path):
    # Its import runs inside the registry's first load: the objective it validates builds the schema from
    # part of the registry (its own kind is not in yet), so the schema is built again once every entry point is.
    eager = "import rlstab\nrlstab.load('grpo')\n" + RATIO_CAP
    make_dist(tmp_path, "eager", {"ratio_cap": "eager_plugin:RatioCap"}, {"eager_plugin": eager})
    # registrations() loads the entry points first, outside any schema build.
    code = f"import rlstab, rlstab.registry; rlstab.registry.registrations(); print(rlstab.load({YAML!r}).masks[0].kind)"
    done = run_python(tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ratio_cap"
