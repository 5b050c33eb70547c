import pytest

from rlstab.errors import ConfigError
from rlstab.lab.regimes import Regime, load_regime, regime_names


def test_shipped_regimes_load_and_default_is_the_demo():
    from rlstab.trainer.config import TrainConfig

    assert {"default", "entropy-collapse", "policy-lag", "sparse", "collapse"} <= set(regime_names())
    for name in regime_names():
        assert load_regime(name).name == name
    default, demo = load_regime("default"), TrainConfig()
    for field in ("lr", "updates_per_step", "temperature", "group_size", "prompts_per_step", "micro_batch_size",
                  "max_grad_norm", "eval_every"):
        assert getattr(default, field) == getattr(demo, field), field
    assert default.policy_lag == 0 and default.task is None


def test_the_stress_regimes_stress_what_they_say():
    default = load_regime("default")
    assert load_regime("policy-lag").policy_lag >= 1
    collapse = load_regime("entropy-collapse")
    assert collapse.lr > default.lr or collapse.updates_per_step > default.updates_per_step
    assert load_regime("sparse").task == "mul2"


def test_the_collapse_regime_is_calibrated_per_seed_on_a_task_with_several_answers():
    collapse, default = load_regime("collapse"), load_regime("default")
    assert collapse.task == "perm3" and collapse.warm_start_band == (0.5, 0.75)
    assert collapse.pass_k >= 1 and collapse.pass_samples >= collapse.pass_k
    assert collapse.lr > default.lr and collapse.updates_per_step > default.updates_per_step
    config = collapse.train_config(steps=10, seed=3)
    assert (config.warm_start_band, config.pass_k, config.seed) == ((0.5, 0.75), collapse.pass_k, 3)
    assert (default.pass_k, default.warm_start_band) == (0, None)  # the other regimes measure as before


def test_the_spurious_regime_is_collapse_on_the_echo_task_at_temperature_one():
    spurious, collapse = load_regime("spurious"), load_regime("collapse")
    assert (spurious.task, spurious.temperature) == ("perm3-echo", 1.0)
    same = ("lr", "updates_per_step", "warm_start_band", "pass_k", "pass_samples", "instruments", "group_size",
            "prompts_per_step", "micro_batch_size", "policy_lag", "warmup_steps")
    assert {f: getattr(spurious, f) for f in same} == {f: getattr(collapse, f) for f in same}
    assert spurious.train_config(steps=100, seed=100).temperature == 1.0


def test_the_small_lm_collapse_regime_is_small_lm_at_adam_3e_4_and_temperature_one():
    collapse, small = load_regime("small-lm-collapse"), load_regime("small-lm")
    assert (collapse.task, collapse.lr, collapse.temperature) == ("add1", 3e-4, 1.0)
    assert (small.lr, small.temperature) == (1e-4, 0.8)
    same = ("updates_per_step", "prompts_per_step", "micro_batch_size", "group_size", "policy_lag", "instruments", "pass_k")
    assert {f: getattr(collapse, f) for f in same} == {f: getattr(small, f) for f in same}


def test_a_user_regime_file_takes_its_name_from_the_file(tmp_path):
    path = tmp_path / "my-lag.yaml"
    path.write_text("policy_lag: 3\nlr: 1.0e-4\n")
    regime = load_regime(str(path))
    assert (regime.name, regime.policy_lag, regime.lr, regime.group_size) == ("my-lag", 3, 1e-4, 8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lr: -1\n", "bad.yaml: lr = -1: Input should be greater than 0"),
        ("policy_lag: 1:20\n", "bad.yaml: policy_lag = '1:20': Input should be a valid integer"),
        ("updates: 4\n", "bad.yaml: updates: unknown field (value 4)"),
        ("- lr\n", "bad.yaml: a regime file holds a mapping of trainer settings, not list"),
        ("name: 'a/b'\n", "bad.yaml: name = 'a/b': String should match pattern"),
        ("lr: !!python/object:os.system x\n", "bad.yaml:"),
    ],
)
def test_a_bad_regime_file_is_one_line_per_problem(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_regime(str(path))
    message = str(err.value)
    assert message.startswith(str(tmp_path / expected)) if expected != "bad.yaml:" else str(path) in message
    assert len(message.splitlines()) == 1 and "Traceback" not in message


def test_unknown_names_suggest_the_shipped_ones():
    with pytest.raises(ConfigError, match="did you mean 'policy-lag'"):
        load_regime("policy_lag")
    with pytest.raises(ConfigError, match="no such file"):
        load_regime("missing.yaml")
    assert load_regime({"name": "x", "policy_lag": 2}) == Regime(name="x", policy_lag=2)
