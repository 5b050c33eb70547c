"""The objective is loaded and checked against GRPOConfig in RlstabGRPOTrainer.__init__, before TRL loads a model.

Rules under test: the objective wins for the policy term (ignored GRPOConfig flags give a
warning); what TRL would add to the loss itself (entropy mask, off-policy mask, entropy bonus,
KL) is refused with the field, its value and what to set.
"""

import warnings

import pytest
import trl

import rlstab
from rlstab import ConfigError
from rlstab.adapters.trl import SUPPORTED_TRL, RlstabGRPOTrainer
from rlstab.adapters.trl.compat import check_version, supported
from rlstab.adapters.trl.config import build_objective, check_config
from rlstab.objective import Objective

from trl_tiny import dataset, grpo_config, length_reward, make_trainer, tiny_model, tokenizer

MISSING_MODEL = "no-such-org/no-such-model"  # loading it would fail: the check must come first


def construct(tmp_path, objective, **config):
    return RlstabGRPOTrainer(
        objective=objective,
        model=MISSING_MODEL,
        reward_funcs=length_reward,
        args=grpo_config(tmp_path, **config),
        train_dataset=dataset(),
        processing_class=tokenizer(),
    )


def refusal(tmp_path, objective, **config) -> str:
    with pytest.raises(ConfigError) as err:
        construct(tmp_path, objective, **config)
    return str(err.value)


def test_a_misspelt_field_names_the_trainer_argument_and_the_yaml_path(tmp_path):
    bad = {"extends": "stapo", "masks": [{"kind": "s2t", "tau_pp": 0.001}]}
    message = refusal(tmp_path, bad)
    assert message.startswith("RlstabGRPOTrainer(objective={'extends': 'stapo'")
    assert "masks[0].tau_pp: unknown field (value 0.001); did you mean 'tau_p'?" in message


def test_an_unknown_preset_and_a_missing_objective_are_refused(tmp_path):
    assert "not a preset" in refusal(tmp_path, "stapoo")
    assert "objective: required" in refusal(tmp_path, None)
    assert "no such file" in refusal(tmp_path, str(tmp_path / "missing.yaml"))


def test_top_entropy_quantile_is_refused_with_the_mask_to_use(tmp_path):
    message = refusal(tmp_path, "dapo", top_entropy_quantile=0.2)
    assert "top_entropy_quantile = 0.2: TRL would add its own entropy mask" in message
    assert "{kind: entropy_quantile, rho: 0.2, side: top}" in message and "20-entropy" in message


def test_a_training_batch_cadence_is_refused_where_a_generation_batch_is_several_optimizer_steps(tmp_path):
    stare = {"extends": "dapo", "reweighters": [{"kind": "stare", "adaptive": True}]}
    message = refusal(tmp_path, stare, steps_per_generation=2, gradient_accumulation_steps=1)
    assert "steps_per_generation = 2 with num_iterations = 1 and gradient_accumulation_steps = 1" in message
    assert "reweighters[0] (stare) moves once per training batch" in message and "cadence: optimizer_step" in message
    assert "num_iterations = 2" in refusal(tmp_path, stare, num_iterations=2)
    per_step = {**stare, "reweighters": [{"kind": "stare", "adaptive": True, "cadence": "optimizer_step"}]}
    with pytest.raises(OSError):  # accepted: the trainer goes on to load the (missing) model
        construct(tmp_path, per_step, steps_per_generation=2, gradient_accumulation_steps=1)


def test_off_policy_mask_is_refused(tmp_path):
    assert "off_policy_mask_threshold = 0.5" in refusal(tmp_path, "dapo", off_policy_mask_threshold=0.5)


def test_trls_entropy_bonus_is_refused_with_the_regulariser_to_use(tmp_path):
    message = refusal(tmp_path, "stapo", entropy_coef=0.01)
    assert "entropy_coef = 0.01: TRL would add its own entropy bonus" in message
    assert "regularisers: [{kind: entropy_bonus, coef: 0.01, average: micro_batch}]" in message
    both = {"extends": "stapo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]}
    assert "already has regularisers[0] (entropy_bonus); set entropy_coef=0.0" in refusal(
        tmp_path, both, entropy_coef=0.01
    )
    adaptive = refusal(tmp_path, "stapo", use_adaptive_entropy=True)
    assert "use_adaptive_entropy = True" in adaptive
    assert "first_step: 'off', average: micro_batch}], TRL's rule" in adaptive


def test_beta_and_the_kl_regulariser_must_agree(tmp_path):
    message = refusal(tmp_path, "stapo", beta=0.04)
    assert "beta = 0.04: TRL would add its own KL term" in message
    assert "{kind: kl, coef: 0.04, estimator: k3}" in message
    kl = {"extends": "stapo", "regularisers": [{"kind": "kl", "coef": 0.01}]}
    assert "regularisers[0] (kl) has coef 0.01; set beta=0.01" in refusal(
        tmp_path, kl, beta=0.0, use_bias_correction_kl=False
    )
    assert "set beta=0.01" in refusal(tmp_path, kl, beta=0.02, use_bias_correction_kl=False)
    message = refusal(tmp_path, kl, beta=0.01)  # use_bias_correction_kl defaults to True
    assert "use_bias_correction_kl = True" in message and "set use_bias_correction_kl=False" in message


def test_every_conflict_is_reported_at_once(tmp_path):
    message = refusal(tmp_path, "stapo", top_entropy_quantile=0.5, entropy_coef=0.1, beta=0.1)
    assert len(message.splitlines()) == 3


def test_policy_flags_the_objective_overrides_give_a_warning(tmp_path):
    # Passes the checks, then TRL fails to load the missing model: the warnings came first.
    with pytest.warns(UserWarning) as record, pytest.raises(OSError):
        construct(
            tmp_path,
            "stapo",
            loss_type="grpo",
            epsilon=0.3,
            epsilon_high=0.5,
            delta=4.0,
            importance_sampling_level="sequence",
        )
    text = "\n".join(str(w.message) for w in record)
    assert "loss_type = 'grpo' is not used" in text
    assert "epsilon = 0.3 is not used: the objective has surrogate.eps_low = 0.2" in text
    assert "epsilon_high = 0.5 is not used: the objective has surrogate.eps_high = 0.28" in text
    assert "delta = 4.0 is not used" in text and "surrogate.dual_clip = 10.0" in text
    assert "importance_sampling_level = 'sequence' is not used" in text


def test_flags_that_agree_with_the_objective_give_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make_trainer(tmp_path, "dapo", loss_type="dapo", epsilon_high=0.28, delta=10.0)
        make_trainer(tmp_path, "dr_grpo", loss_type="dr_grpo", delta=3.0, scale_rewards="none")
        make_trainer(
            tmp_path, "cispo", loss_type="cispo", epsilon_high=5.0
        )  # TRL's cap is the preset's max_weight
        make_trainer(
            tmp_path,
            "gspo",
            loss_type="grpo",
            importance_sampling_level="sequence",
            epsilon=3e-4,
            epsilon_high=4e-4,
        )
        make_trainer(tmp_path, "sapo", loss_type="sapo", sapo_temperature_neg=1.05)
        make_trainer(tmp_path, "vespo", loss_type="vespo")
        make_trainer(
            tmp_path, {"extends": "vespo", "surrogate": {"k_pos": 1.5}}, loss_type="vespo", vespo_k_pos=1.5
        )  # the same number stated in both places


def test_surrogate_specific_flags_are_compared_with_their_own_field(tmp_path):
    with pytest.warns(
        UserWarning, match=r"epsilon_high = 3.0 is not used: the objective has surrogate.max_weight = 5.0"
    ):
        make_trainer(tmp_path, "cispo", epsilon_high=3.0)
    with pytest.warns(UserWarning, match=r"sapo_temperature_pos = 2.0 .* surrogate.tau_pos = 1.0"):
        make_trainer(tmp_path, "sapo", sapo_temperature_pos=2.0)
    with pytest.warns(
        UserWarning, match=r"epsilon = 0.1 is not used: the objective's surrogate \(sapo\) decides"
    ):
        make_trainer(tmp_path, "sapo", epsilon=0.1)
    with pytest.warns(UserWarning, match=r"vespo_lambda_neg = 4.0 .* surrogate.lambda_neg = 2.0"):
        make_trainer(tmp_path, "vespo", vespo_lambda_neg=4.0)
    with pytest.warns(
        UserWarning, match=r"vespo_k_pos = 1.5 is not used: the objective's surrogate \(ppo_clip\) decides"
    ):
        make_trainer(tmp_path, "dapo", vespo_k_pos=1.5)


def test_advantage_estimator_disagreement_gives_a_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"scale_rewards = 'group'.*corresponds to scale_rewards='none'"):
        make_trainer(tmp_path, "dr_grpo")
    with pytest.warns(UserWarning, match=r"advantage estimator \(rloo\) is not used"):
        make_trainer(tmp_path, {"extends": "grpo", "advantage": {"kind": "rloo"}})


def test_default_config_is_checked_after_trl_builds_it(tmp_path, monkeypatch):
    """With args=None TRL builds its own GRPOConfig; the objective is checked against that one.

    TRL's default config asks for bf16, which a CPU refuses, so the default TRL builds is replaced
    by a CPU one that also carries a conflict: the refusal proves the check ran on TRL's config.
    """
    import trl.trainer.grpo_trainer as grpo_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        grpo_module,
        "GRPOConfig",
        lambda output_dir: grpo_config(tmp_path / output_dir, top_entropy_quantile=0.2),
    )
    with pytest.raises(ConfigError, match="top_entropy_quantile = 0.2"):
        RlstabGRPOTrainer(
            objective="stapo",
            model=tiny_model(),
            reward_funcs=length_reward,
            train_dataset=dataset(),
            processing_class=tokenizer(),
        )


def test_args_given_by_position_are_checked_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="top_entropy_quantile = 0.2"):
        RlstabGRPOTrainer(
            MISSING_MODEL, length_reward, grpo_config(tmp_path, top_entropy_quantile=0.2), objective="dapo"
        )


def test_step_statistics_option_is_checked(tmp_path):
    with pytest.raises(ValueError, match="step_statistics='window'"):
        make_trainer(tmp_path, "stapo", step_statistics="window")
    with pytest.raises(
        ValueError, match="steps_per_generation = 3 is not a multiple of gradient_accumulation_steps = 2"
    ):
        make_trainer(
            tmp_path,
            "stapo",
            step_statistics="optimizer_step",
            gradient_accumulation_steps=2,
            steps_per_generation=3,
        )


def test_other_trl_versions_get_a_warning(monkeypatch):
    assert SUPPORTED_TRL == "1.16.0" and trl.__version__ == SUPPORTED_TRL
    assert supported("1.16.3") and not supported("1.17.0") and not supported("0.16.0")
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.warns(UserWarning, match="tested with trl==1.16.0; this is trl 1.17.0"):
        check_version()


def test_config_checks_compile_nothing(tmp_path, monkeypatch):
    """The checks read the objective's plan, so they need no torch of rlstab's own.

    TRL's GRPOConfig imports torch itself (through transformers' TrainingArguments), so the test
    holds TRL's checks to what keeps them torch-free (they never compile the objective);
    tests/adapters/openrlhf/test_config.py runs a launcher's checks without torch in sys.modules.
    """

    def compile_refused(self):
        raise AssertionError("a config check compiled the objective")

    monkeypatch.setattr(Objective, "compile", compile_refused)
    args = grpo_config(tmp_path)
    outcomes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in rlstab.preset_names():
            try:
                check_config(build_objective(name), args)
                outcomes[name] = True
            except ConfigError:
                outcomes[name] = False
    assert outcomes["stapo"] and not outcomes["four_layers"]  # accepted and refused both ran
