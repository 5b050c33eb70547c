"""``rlstab.explain``: the composed objective as a formula with every parameter, and where each part runs."""

import rlstab
from rlstab.explain import UNNAMED, explain, trainer_lines

MASKED = {"extends": "grpo", "log_ratio_clamp": 5.0, "masks": [{"kind": "expression", "silence": "entropy > 1"}],
          "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]}


def test_the_first_line_is_the_name_then_the_description():
    lines = explain(rlstab.load("grpo")).splitlines()
    assert lines[0] == "grpo"
    assert lines[1].startswith("  GRPO as veRL runs it by default")


def test_an_unnamed_objective_says_where_it_came_from_and_how_to_name_it():
    assert explain(rlstab.load(MASKED), source="mine.yaml").splitlines()[0] == f"mine.yaml ({UNNAMED})"
    assert explain(rlstab.load(MASKED)).splitlines()[0] == f"objective ({UNNAMED})"


def test_the_formula_names_only_the_layers_the_objective_has():
    assert "L = Agg[ l(r, A) ]" in explain(rlstab.load("grpo")).splitlines()
    text = explain(rlstab.load(MASKED))
    # a mask (M), no reweighter (no W), one regulariser with c = 0.01
    assert "L = Agg[ M * l(r, A) ] + 0.01 * Agg_valid(R0)" in text.splitlines()
    assert "  r   = exp(clamp(logp - old_logp, -5, 5))" in text.splitlines()  # log_ratio_clamp: 5
    assert "        masks[0] expression: silence iff entropy > 1" in text.splitlines()
    assert "  R0  = entropy_bonus: + 0.01 * Agg(-H)" in text.splitlines()


def test_every_part_describes_its_parameters():
    text = explain(rlstab.load("grpo"))
    assert "  l   = ppo_clip: l = max(-A r, -A clip(r, 0.8, 1.2)); for A < 0, l = min(l, -3 A) (dual-clip)" in text
    assert "  Agg = token-mean: sum over tokens / number of valid tokens in the step" in text


def test_trainer_lines_name_the_batch_fields_and_what_a_trainer_refuses():
    generic = trainer_lines(rlstab.load(MASKED))
    assert generic[0] == "Batch fields it reads (TokenBatch):"
    assert "  entropy: masks[0] (expression), regularisers[0] (entropy_bonus)" in generic
    verl = trainer_lines(rlstab.load(MASKED), "verl")
    assert "Where each part runs with veRL:" in verl and "veRL refuses:" in verl
    assert any(line.startswith("  regularisers[0] (entropy_bonus): not available in veRL") for line in verl)
    assert "veRL refuses nothing of it." in trainer_lines(rlstab.load("grpo"), "verl")
