"""Every fenced code block of README.md and docs/ is checked, here or by a named test, so none can drift.

The blocks are found by reading the pages, not listed by hand: a new block gets the check of its
language, and fails until it passes it or is accounted for in one of the tables below.

- ``yaml``: loads with ``yaml.safe_load``; an objective (it has ``extends`` or ``aggregation``) passes
  ``rlstab validate``, a fragment (only objective fields, e.g. a ``masks:`` list) passes it under
  ``extends: grpo``; a lab regime loads as a regime.
- ``python``: compiles; then runs in a temporary folder (with the files the page's YAML blocks name,
  and a declared ``SETUP`` where the page's text implies names it does not define), unless a named
  test checks it, it needs a trainer (its ``objective=`` arguments are loaded, and the trainer's own
  test named), or it is a sketch of rlstab's own code (the calls it shows are checked in that code).
- ``bash``, ``console``, ``text``: every ``rlstab`` command parses with the CLI's own parser; the
  quick ones (``presets``, ``validate``, ``explain``, ``schema``, ``components``) run, and the output a
  console block shows is regenerated and compared; ``pip install`` names extras the package has and
  pins the scripts use; ``bash`` names a script that exists; the trainer commands' rlstab parts load.
- Anything else is in ``ALLOWLIST``, keyed by page and a digest of the block, with its reason.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import io
import re
import shlex
import textwrap
from dataclasses import dataclass
from importlib.metadata import metadata
from pathlib import Path

import pytest
import yaml

import rlstab
from rlstab.cli import build_parser, main
from rlstab.objective import Objective

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OPENING = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:10]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}:{self.lang or 'plain'}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each dedented by its fence's indentation."""
    blocks, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = next((j for j in range(i + 1, len(lines)) if re.fullmatch(rf" *{fence[0]}{{{len(fence)},}} *", lines[j])), None)
        assert end is not None, f"{path}:{i + 1}: a fence that is never closed"
        body = [re.sub(f"^ {{0,{indent}}}", "", line) for line in lines[i + 1 : end]]
        blocks.append(Block(str(path.relative_to(ROOT)), i + 1, opening["lang"], "".join(f"{line}\n" for line in body)))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]


def rule(table: dict, block: Block):
    """The entry of a table keyed by (page, a line the block holds) that matches the block, or None."""
    found = [value for (page, needle), value in table.items() if page == block.page and needle in block.text.splitlines()]
    assert len(found) <= 1, f"{block}: matched by several entries"
    return found[0] if found else None


# Blocks another test checks in full: (page, a line the block holds) -> that test. The generic check of
# the block's language (YAML loads, Python compiles, commands parse) still runs here.
ELSEWHERE = {
    ("docs/yaml.md", "  - {kind: s2t, tau_p: 1.5, entropy_quantil: 0.8}"): "tests/docs/test_yaml_page.py::test_the_bad_file_prints_what_the_page_shows",
    ("docs/yaml.md", "$ rlstab validate bad.yaml"): "tests/docs/test_yaml_page.py::test_the_bad_file_prints_what_the_page_shows",
    ("docs/yaml.md", "dup.yaml: line 3, column 1: duplicate key 'name'"): "tests/docs/test_yaml_page.py::test_the_other_messages_are_what_the_small_files_print",
    ("docs/yaml.md", "$ rlstab validate dapo-s2t.yaml bad.yaml"): "tests/docs/test_yaml_page.py::test_validate_of_a_good_and_a_bad_file",
    ("docs/yaml.md", "$ rlstab presets"): "tests/docs/test_yaml_page.py::test_presets_output",
    ("docs/yaml.md", "$ rlstab validate --trainer verl stapo tis"): "tests/adapters/test_trainers.py::test_the_yaml_pages_block_is_what_validate_prints",
    ("docs/expressions.md", "# config.yaml"): "tests/docs/test_expressions_page.py::test_the_file_prints_the_line_the_page_shows",
    ("docs/expressions.md", "$ rlstab validate config.yaml"): "tests/docs/test_expressions_page.py::test_the_file_prints_the_line_the_page_shows",
    ("docs/expressions.md", "    compile_expression(\"advantage > 0 and entropy and 0.3\")"): "tests/docs/test_expressions_page.py::test_the_python_block_prints_the_caret_drawing",
    ("docs/expressions.md", "                      ^"): "tests/docs/test_expressions_page.py::test_the_python_block_prints_the_caret_drawing",
    ("docs/lab.md", "results = compare([\"grpo\", \"stapo\"], seeds=5, steps=100, regimes=[\"default\", \"policy-lag\"], out=\"runs/lab\")"): "tests/docs/test_lab_page.py::test_the_python_example_runs",
    ("docs/lab.md", "description: >-"): "tests/docs/test_lab_page.py::test_the_regime_blocks_are_the_shipped_files_in_order",
    ("docs/plugins.md", "# examples/rlstab-wreinforce/rlstab_wreinforce/w_reinforce.py"): "tests/docs/test_plugins_page.py::test_the_example_files_are_shown_verbatim",
    ("docs/plugins.md", "    check_component(WReinforce())"): "tests/docs/test_plugins_page.py::test_the_kit_example_runs",
    ("docs/plugins.md", "[project.entry-points.\"rlstab.components\"]"): "tests/docs/test_plugins_page.py::test_the_entry_point_block_is_the_plugins_declaration",
    ("docs/plugins.md", "$ rlstab components --family reweighters"): "tests/docs/test_plugins_page.py::test_the_listing_is_what_rlstab_components_prints",
    ("docs/troubleshooting.md", "loss_fn(batch)"): "tests/docs/test_troubleshooting_page.py::test_the_block_shows_what_it_does",
    ("docs/troubleshooting.md", "rlstab.load(\"extends: grpo\\nmasks: [{kind: ratio_cap}]\\n\")"): "tests/docs/test_troubleshooting_page.py::test_the_block_shows_what_it_does",
    ("docs/troubleshooting.md", "    print(line)"): "tests/docs/test_troubleshooting_page.py::test_the_block_shows_what_it_does",
    ("docs/troubleshooting.md", "main([\"demo\"])  # in an environment without the demo extra"): "tests/docs/test_troubleshooting_page.py::test_the_block_shows_what_it_does",
    ("docs/audit.md", "task = get_task(\"add2\")"): "tests/docs/test_every_block.py::test_the_audit_example_runs",
    ("docs/presets.md", "name: stapo"): "tests/docs/test_every_block.py::test_the_stapo_block_is_the_preset_file",
    ("docs/install.md", "pip install torch==2.13.0"): "tests/docs/test_install_page.py::test_every_command_is_one_the_scripts_run",
    # Trainer commands and scripts, run in the trainer's own environment (scripts/test.sh).
    ("docs/adapters/verl.md", "python3 -m verl.trainer.main_ppo \\"): "tests/adapters/verl/test_docs_command.py::test_documented_command_composes_and_passes_verls_validation",
    ("docs/adapters/openrlhf.md", "python -m rlstab.adapters.openrlhf --objective stapo \\"): "tests/adapters/openrlhf/test_launcher.py::test_documented_command_passes_openrlhfs_parser_and_starts_ray_with_the_hook",
    ("docs/adapters/openrlhf.md", "# examples/openrlhf-arithmetic/reward.py"): "tests/docs/test_openrlhf_example.py::test_the_page_shows_the_reward_file_verbatim",
    ("docs/adapters/trl.md", "from rlstab.adapters.trl import RlstabGRPOTrainer"): "tests/adapters/trl/test_example.py::test_the_example_config_agrees_with_the_objective_and_trains",
    ("docs/adapters/trl.md", "from trl_grpo_stapo import DATASET, build_trainer, make_config"): "tests/adapters/trl/test_example.py::test_the_single_gpu_example_trains",
}

# Objective files a page shows to print their errors: they must fail to validate (the page's test
# compares the message).
INVALID_ON_PURPOSE = {
    ("docs/yaml.md", "  - {kind: s2t, tau_p: 1.5, entropy_quantil: 0.8}"),
    ("docs/expressions.md", "# config.yaml"),
}

# Objective files a page shows to print the note of a list that drops a parent's component: they
# validate, with that note under the ok line (the page's console block shows it in full).
NOTED_ON_PURPOSE = {
    ("docs/yaml.md", "masks: [{kind: entropy_quantile, rho: 0.8}]"),
}

# Python blocks that need a trainer: their ``objective=`` arguments load here; the test named in
# ELSEWHERE (or none, said here) runs them with the trainer.
NEEDS_A_TRAINER = {
    ("docs/adapters/trl.md", "from rlstab.adapters.trl import RlstabGRPOTrainer"): "trl",
    ("docs/adapters/trl.md", 'RlstabGRPOTrainer(objective={"extends": "stapo", "surrogate": {"eps_high": 0.3}}, **grpo_trainer_arguments)'): "trl",
    # needs a vLLM server; tests/adapters/trl/test_async_grpo.py trains the same class with a stand-in rollout worker
    ("docs/adapters/trl.md", "from rlstab.adapters.trl import RlstabAsyncGRPOTrainer"): "trl",
}

# What a Python block uses that its page's text implies but does not define: run before the block.
_BATCH = """
import torch
import rlstab
torch.manual_seed(0)
B, T = 4, 8
logprobs = (-3 * torch.rand(B, T)).requires_grad_()
old_logprobs = logprobs.detach()
response_mask = torch.ones(B, T, dtype=torch.bool)
entropy = torch.rand(B, T)
rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
group_ids = torch.tensor([0, 0, 1, 1])
"""
_STEP = _BATCH + """
loss_fn = rlstab.load(OBJECTIVE).compile()
def _micro_batch():
    lp = (-3 * torch.rand(B, T)).requires_grad_()
    return rlstab.TokenBatch(logprobs=lp, old_logprobs=lp.detach() - 0.1 * torch.rand(B, T),
                             rollout_logprobs=lp.detach() - 0.1 * torch.rand(B, T), response_mask=response_mask,
                             entropy=torch.rand(B, T), rewards=rewards, group_ids=group_ids)
micro_batches = [_micro_batch(), _micro_batch()]
params = [torch.zeros(1, requires_grad=True)]
optimizer = torch.optim.Adam(params, lr=1e-6)
base_lr = 1e-6
"""
SETUP = {
    ("README.md", "    logprobs=logprobs,            # [B, T] current policy, with grad"): _BATCH,
    ("README.md", "    loss_fn(mb, step=stats).loss.backward() # the sum over micro-batches equals the whole step"): _STEP.replace("OBJECTIVE", '"stapo"'),
    ("README.md", "from rlstab.stats import token_stats"): """
import torch
from types import SimpleNamespace
V, D = 50, 16
_embed, _head = torch.nn.Embedding(V, D), torch.nn.Linear(D, V, bias=False)
model = SimpleNamespace(model=lambda ids: SimpleNamespace(last_hidden_state=_embed(ids)), lm_head=_head)
input_ids = torch.randint(0, V, (2, 9))
""",
    ("docs/concepts.md", "    out = loss_fn(mb, step=stats)         # phase 2: this micro-batch's share of the step loss"): _STEP.replace("OBJECTIVE", '"stapo"'),
    # the objective of the page's YAML block above it (overlong shaping, dynamic sampling, the ESS scale)
    ("docs/reference/step.md", "stats = loss_fn.gather(micro_batches)"): _STEP.replace(
        "OBJECTIVE", '{"extends": "dapo", "reward_shaping": [{"kind": "overlong", "max_length": 20480, "buffer": 4096}], '
        '"group_filter": {"kind": "dynamic_sampling"}, "lr_scale": {"kind": "ess"}}'),
    ("docs/reference/stats.md", "from rlstab.stats import token_stats, token_stats_from_logits"): """
import torch, rlstab
from types import SimpleNamespace
B, T, D, V = 2, 7, 16, 50
hidden, model = torch.randn(B, T, D), SimpleNamespace(lm_head=torch.nn.Linear(D, V, bias=False))
logits, labels = torch.randn(B, T, V), torch.randint(0, V, (B, T))
labels[1, 5:] = -100  # padding
""",
    ("docs/reference/reweighters.md", "checkpoint[\"rlstab\"] = loss_fn.state_dict()          # plain floats and bools"): "import rlstab\ncheckpoint = {}\n",
}

# Python blocks that sketch rlstab's own code rather than run as they stand: (page, a line) ->
# (the file whose code they sketch, the calls that code must make).
SKETCHES = {
    ("docs/demo.md", "clip_grad_norm_(policy.trainable_parameters(), 1.0); optimizer.step()"): (
        "rlstab/trainer/loop.py",
        ["loss_fn.gather([batch(rows, current_logprobs[rows], current_entropy[rows]) for rows in parts])",
         "entropy_grad = any(isinstance(r, EntropyBonus) for r in loss_fn.objective.regularisers)",
         "policy.token_stats(rows_slice(rollout, rows), entropy_grad=entropy_grad)",
         "loss_fn(batch(rows, logprobs, entropy if entropy_grad else entropy.detach()), step=stats)",
         "clip_grad_norm_("]),
}

# Blocks no check applies to: (page, digest of the block) -> why. Keep it short.
ALLOWLIST = {
    ("docs/expressions.md", "93d6cff87e"): "the expression grammar in EBNF, prose; the parser's tests (tests/expression) hold the language",
}

# Commands of other tools that a page shows, with why they are not run.
OTHER_COMMANDS = {
    "ray start --head": "Ray's own command (the ray extra), starting a cluster",
}

# A text block that shows what a command prints, with the files the page's text implies.
TEXT_OUTPUTS = {
    ("docs/adapters/openrlhf.md", "rlstab: --objective -> my-objective.yaml: masks[0].tau_pp: unknown field (value 0.1); did you mean 'tau_p'?"): (
        ["python", "-m", "rlstab.adapters.openrlhf", "--objective", "my-objective.yaml"],
        {"my-objective.yaml": "extends: stapo\nmasks:\n  - {kind: s2t, tau_pp: 0.1}\n"},
    ),
}

QUICK = {"presets", "validate", "explain", "schema", "components"}  # subcommands run here; the others only parse
OBJECTIVE_KEYS = set(Objective.model_fields) | {"extends"}


def how(block: Block) -> str:
    """The check a block gets."""
    key = (block.page, block.digest)
    if key in ALLOWLIST:
        return "allowlisted"
    if block.lang == "python" and rule(SKETCHES, block):
        return "sketch"
    if block.lang == "python" and rule(NEEDS_A_TRAINER, block):
        return "trainer"
    if rule(ELSEWHERE, block):
        return "elsewhere"
    if block.lang in ("yaml", "python", "bash", "console", "text"):
        return "here"
    return "unaccounted"


def page_files(page: str) -> dict[str, str]:
    """The files a page's YAML blocks name in their first line (``# dapo-s2t.yaml: ...``)."""
    files = {}
    for block in BLOCKS:
        named = re.match(r"# ([\w./-]+\.ya?ml)\b", block.text)
        if block.page == page and block.lang == "yaml" and named:
            files[named[1]] = block.text
    return files


@pytest.fixture
def folder(tmp_path, monkeypatch):
    def make(page: str) -> Path:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a block that trains caches nothing of the user's
        for name, text in page_files(page).items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        return tmp_path

    return make


def run_cli(capsys, argv: list[str]) -> tuple[int, list[str]]:
    """``rlstab argv`` in-process: exit status, and stdout then stderr as lines."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out.splitlines() + err.splitlines()


def parses(argv: list[str]) -> None:
    """The command parses, and its number flags are within their ranges (``rlstab.number_flags``)."""
    from rlstab.number_flags import check_numbers

    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exit_:
            raise AssertionError(f"rlstab {shlex.join(argv)}: {err.getvalue().strip()}") from exit_
        assert check_numbers(args, "rlstab"), f"rlstab {shlex.join(argv)}: {err.getvalue().strip()}"


# ----- YAML


def check_yaml(block: Block, folder, capsys) -> None:
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block}: not a mapping"
    if block.page == "docs/lab.md":  # regime files (test_lab_page checks them against the shipped ones), or a protocol
        from rlstab.lab import load_regime
        from rlstab.lab.protocol import validate_protocol

        if "gates" in data:
            validate_protocol(data)
        else:
            load_regime({"name": "block", **data})
        return
    assert set(data) <= OBJECTIVE_KEYS, f"{block}: {sorted(set(data) - OBJECTIVE_KEYS)} are not objective fields"
    here = folder(block.page)
    named = re.match(r"# ([\w./-]+\.ya?ml)\b", block.text)
    if named:
        path = named[1]
    else:
        path = "block.yaml"
        text = block.text if {"extends", "aggregation"} & set(data) else "extends: grpo\n" + block.text  # a fragment
        (here / path).write_text(text)
    if block.page == "docs/plugins.md" and importlib.util.find_spec("rlstab_wreinforce") is None:
        code, lines = run_cli(capsys, ["validate", path])
        assert code == 1 and "unknown kind" in lines[0], lines  # the plugin is not installed here
        return
    code, lines = run_cli(capsys, ["validate", path])
    if rule({k: True for k in INVALID_ON_PURPOSE}, block):
        assert code == 1, lines
    elif rule({k: True for k in NOTED_ON_PURPOSE}, block):
        assert (code, lines[0], len(lines)) == (0, f"{path}: ok (objective)", 2), lines
        assert lines[1].startswith(f"{path}: note: masks replaces"), lines
    else:
        assert (code, lines[-1:]) == (0, [f"{path}: ok ({rlstab.load(path).name or 'objective'})"]), lines


# ----- Python


def check_python(block: Block, folder, kind: str) -> None:
    tree = ast.parse(block.text, filename=str(block))
    if kind == "sketch":
        source, calls = rule(SKETCHES, block)
        code = (ROOT / source).read_text()
        for call in calls:
            assert call in block.text and call in code, f"{block}: {call!r} is not what {source} does"
        return
    if kind == "trainer":
        checked = 0
        for node in ast.walk(tree):
            for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                if keyword.arg == "objective":
                    assert isinstance(rlstab.load(ast.literal_eval(keyword.value)), Objective), block
                    checked += 1
        assert checked, f"{block}: no objective= argument to check"
        if "from rlstab.adapters.trl import RlstabGRPOTrainer" in block.text:  # the example file, verbatim
            assert block.text == (ROOT / "examples" / "trl_grpo_stapo.py").read_text()
        return
    if kind == "elsewhere":
        return
    folder(block.page)
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(textwrap.dedent(rule(SETUP, block) or ""), f"setup of {block}", "exec"), namespace)
        exec(compile(tree, str(block), "exec"), namespace)


def test_the_audit_example_runs(monkeypatch, tmp_path):
    """docs/audit.md's Python, on a tiny model warm-started for 5 steps instead of 130 (its numbers are not shown)."""
    import rlstab.trainer.models as models

    (block,) = [b for b in BLOCKS if b.page == "docs/audit.md" and b.lang == "python"]
    real = models.load_policy
    monkeypatch.setattr(models, "load_policy", lambda name, task: real(name, task, cache_dir=tmp_path, warm_start_steps=5))
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.text, str(block), "exec"), {})
    assert "| stapo" in printed.getvalue() and "s2t" in printed.getvalue()


# ----- commands


def commands(block: Block) -> list[tuple[list[str], list[str] | None]]:
    """(argv, the output shown after it, or None where the block shows none) per command of a block."""
    if block.lang == "console":
        found, lines = [], block.text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("$ ")), len(lines))
                found.append((shlex.split(line[2:], comments=True), lines[i + 1 : end]))
        return found
    joined = block.text.replace("\\\n", " ")
    return [(shlex.split(line, comments=True), None) for line in joined.splitlines() if shlex.split(line, comments=True)]


def check_pip(argv: list[str]) -> None:
    extras = set(metadata("rlstab").get_all("Provides-Extra"))
    scripts = "\n".join(p.read_text() for p in (ROOT / "scripts").glob("*.sh"))
    for requirement in [word for word in argv[2:] if not word.startswith("-")]:
        project = re.fullmatch(r"(?:rlstab|\.)(?:\[([\w,-]+)\])?", requirement)
        if project:
            assert set(filter(None, (project[1] or "").split(","))) <= extras, requirement
        elif requirement.startswith("./"):
            assert (ROOT / requirement).is_dir(), requirement
        else:  # another package: pinned as the set-up scripts pin it
            assert "==" in requirement and requirement in scripts, requirement


def check_verl_overrides(overrides: list[str]) -> None:
    """The rlstab parts of veRL overrides (verl's own test composes the whole command)."""
    values = {}
    for override in overrides:
        key, _, value = override.partition("=")
        assert re.fullmatch(r"\+?[\w.]+", key) and _, override
        values[key.lstrip("+")] = value
    loss = "actor_rollout_ref.actor.policy_loss."
    target = values.get(loss + "_target_")
    if target:
        module, name = target.rsplit(".", 1)  # verl is not installed here: the class is found in the source
        package = ROOT.joinpath(*module.split("."))
        assert any(f"class {name}(" in f.read_text() for f in package.glob("*.py")), target
        assert name in (package / "__init__.py").read_text(), target
        assert values[loss + "loss_mode"] == "rlstab"
    objective = values.get(loss + "objective", "stapo")  # an overrides line alone is the page's stapo example
    overrides_yaml = values.get(loss + "overrides")
    source = {"extends": objective, **yaml.safe_load(overrides_yaml)} if overrides_yaml else objective
    assert isinstance(rlstab.load(source), Objective), overrides


def check_command(block: Block, argv: list[str], shown: list[str] | None, capsys, folder) -> None:
    text = shlex.join(argv)
    if argv[0] == "rlstab":
        rest, redirect = argv[1:], None
        if ">" in rest:
            rest, redirect = rest[: rest.index(">")], rest[rest.index(">") + 1]
        parses(rest)
        if rest[0] not in QUICK or how(block) == "elsewhere":
            return
        folder(block.page)
        code, lines = run_cli(capsys, rest)
        assert code == 0, (text, lines)
        if redirect:
            Path(redirect).write_text("".join(f"{line}\n" for line in lines))
            assert not shown, text
        elif shown is not None:
            assert lines == shown, text
    elif argv[0] == "bash":
        assert (ROOT / argv[1]).is_file(), text
    elif argv[:2] == ["pip", "install"]:
        check_pip(argv)
    elif argv[:3] == ["python", "-m", "rlstab.adapters.openrlhf"]:
        from rlstab.adapters.openrlhf.config import build_objective
        from rlstab.adapters.openrlhf.launcher import parser

        ours, _ = parser().parse_known_args(argv[3:])
        overrides = yaml.safe_load(ours.objective_overrides) if ours.objective_overrides else None
        assert isinstance(build_objective(ours.objective, overrides), Objective), text
    elif argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]:
        check_verl_overrides(argv[3:])
    elif argv[0].startswith("+actor_rollout_ref."):
        check_verl_overrides(argv)
    else:
        assert next((reason for prefix, reason in OTHER_COMMANDS.items() if text.startswith(prefix)), None), \
            f"{block}: no check for the command {text!r}"


def check_commands(block: Block, capsys, folder) -> None:
    if block.lang == "text":
        produced = rule(TEXT_OUTPUTS, block)
        assert produced or how(block) == "elsewhere", f"{block}: a text block that no check produces"
        if produced:
            argv, files = produced
            here = folder(block.page)
            for name, text in files.items():
                (here / name).write_text(text)
            from rlstab.adapters.openrlhf.launcher import main as launch

            assert argv[:3] == ["python", "-m", "rlstab.adapters.openrlhf"]
            with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exit_:
                launch(argv[3:])
            assert (exit_.value.code, err.getvalue()) == (2, block.text)
        return
    found = commands(block)
    assert found or how(block) == "elsewhere", f"{block}: no command in it"
    for argv, shown in found:
        check_command(block, argv, shown, capsys, folder)


# ----- the tests


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_block_is_checked(block, capsys, folder):
    kind = how(block)
    assert kind != "unaccounted", f"{block}: a {block.lang or 'plain'} block that nothing checks; give it a language with a check, or a test"
    if kind == "allowlisted":
        return
    if block.lang == "yaml":
        check_yaml(block, folder, capsys)
    elif block.lang == "python":
        check_python(block, folder, kind)
    elif block.lang in ("bash", "console", "text"):
        check_commands(block, capsys, folder)
    else:
        assert kind == "elsewhere", block


def test_every_page_is_read_and_has_its_blocks():
    assert {p.name for p in PAGES} >= {"README.md", "index.md", "yaml.md", "demo.md", "verl.md", "stats.md"}
    assert len(BLOCKS) >= 60


@pytest.mark.parametrize("table", ["ELSEWHERE", "SETUP", "SKETCHES", "NEEDS_A_TRAINER", "TEXT_OUTPUTS", "INVALID_ON_PURPOSE", "NOTED_ON_PURPOSE"])
def test_every_entry_of_the_tables_matches_a_block(table):
    entries = globals()[table]
    for page, needle in entries:
        matched = [b for b in BLOCKS if b.page == page and needle in b.text.splitlines()]
        assert matched, f"{table}: ({page!r}, {needle!r}) matches no block"


def test_every_allowlisted_block_is_still_there():
    digests = {(b.page, b.digest) for b in BLOCKS}
    assert set(ALLOWLIST) <= digests, set(ALLOWLIST) - digests


def test_the_tests_named_exist():
    for test in set(ELSEWHERE.values()):
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), test


def test_the_readme_validate_comment_is_what_validate_prints(tmp_path, monkeypatch, capsys):
    """The README's example error line is what ``rlstab validate`` prints for its file with tau_p 1.5."""
    readme = [b for b in BLOCKS if b.page == "README.md"]
    (objective,) = [b for b in readme if b.text.startswith("# my_objective.yaml")]
    (comment,) = re.findall(r"#\s+(my_objective\.yaml: .*)", "".join(b.text for b in readme if b.lang == "bash"))
    monkeypatch.chdir(tmp_path)
    Path("my_objective.yaml").write_text(objective.text.replace("tau_p: 0.002", "tau_p: 1.5"))
    assert run_cli(capsys, ["validate", "my_objective.yaml"]) == (1, [comment.strip()])


def test_the_stapo_block_is_the_preset_file():
    """docs/presets.md shows the stapo preset's file "plus its description"."""
    (block,) = [b for b in BLOCKS if b.page == "docs/presets.md" and b.lang == "yaml"]
    from rlstab.presets import preset_path

    shipped = yaml.safe_load(preset_path("stapo").read_text())
    assert "description" in shipped
    assert yaml.safe_load(block.text) == {k: v for k, v in shipped.items() if k != "description"}


def test_the_demo_pages_examples_are_the_tasks_demonstrations():
    """docs/demo.md's add2 and mul2 examples are what the tasks demonstrate in the warm start."""
    from rlstab.trainer.tasks import Problem, get_task

    page = " ".join((ROOT / "docs" / "demo.md").read_text().split())
    add2 = get_task("add2").demonstration(Problem("47+38=", "85"))
    assert f"prompt 47+38= response {add2}<eos>" in page
    mul2 = get_task("mul2").demonstration(Problem("47*38=", "1786"))
    assert f"`47*38=` → `{mul2}`" in page


def test_the_readme_layout_names_paths_that_exist():
    """The README's Layout block (an indented block) names folders and files of the repository."""
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout\n\n", 1)[1].split("\n\n", 1)[0]
    paths = re.findall(r"^    (\S+/\S*|\S+\.py)\s", layout, flags=re.M)
    assert len(paths) >= 15
    for path in paths:
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize(("page", "label", "problem"), [
    ("docs/adapters/verl.md", "actor_rollout_ref.actor.policy_loss (objective='stapo', with overrides)", {"kind": "s2t", "tau_pp": 0.1}),
    ("docs/adapters/trl.md", "RlstabGRPOTrainer(objective={'extends': 'stapo', ...})", {"kind": "s2t", "tau_pp": 0.001}),
])
def test_the_adapters_inline_error_examples_end_with_rlstabs_message(page, label, problem):
    """The trainers' own tests check the label in their environments; the problem is rlstab's wording."""
    with pytest.raises(rlstab.ConfigError) as err:
        rlstab.load({"extends": "stapo", "masks": [problem]})
    (line,) = str(err.value).splitlines()
    assert f"`{label}: {line.split(': ', 1)[1]}`" in " ".join((ROOT / page).read_text().split())
