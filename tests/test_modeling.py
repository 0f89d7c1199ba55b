"""Tiny model and training plumbing: tokenizer, determinism, save/load round trip, atomic
outputs, noisy SFT demonstrations, TRL arguments from params, resume bookkeeping, and
training configs that must fail before any work starts.

    pytest -q tests/test_modeling.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from components import model as model_stage
from components.common.errors import InputError
from components.models import modelio
from components.problems import gsm8k
from components.problems.sources import read_split
from components.sft import build_demos, untagged_target, wrong_answer
from components.training import finetune
from components.training.train_samples import greedy
from pipelines.params.config import ConfigError, ModelParams, load_params

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(
    name_or_path="tiny", tiny_hidden_size=32, tiny_intermediate_size=64, tiny_num_layers=1, tiny_num_heads=2,
    tiny_vocab_size=300,
)


def write_rows(path: Path, n: int = 40, seed: int = 0) -> Path:
    from components.problems.sources import convert_row
    from components.problems.synthetic import synthetic_problem

    rng = random.Random(seed)
    rows = [convert_row(synthetic_problem(rng), f"r{i}") for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("data") / "train.jsonl")


@pytest.fixture(scope="module")
def tiny(train_file):
    return model_stage.build_tiny(ModelParams(**SMALL), train_file)


# --------------------------------------------------------------------------- tiny model


def test_tokenizer_splits_digits_and_has_chat_template(tiny):
    _, tok = tiny
    pieces = tok.convert_ids_to_tokens(tok("Ann has 128 pens.")["input_ids"])
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "8"]
    assert (
        tok.eos_token == "<|im_end|>"
        and tok.pad_token == "<|endoftext|>"
        and tok.pad_token_id != tok.eos_token_id
    )
    prompt = gsm8k.render_prompt("What is 2 + 3?", tok)
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    text = gsm8k.format_target("2 + 3 = 5", "5")
    assert tok.decode(tok(text)["input_ids"]) == text


def test_tiny_model_is_identical_for_the_same_seed(train_file, tmp_path):
    cfg = ModelParams(**SMALL)
    a = model_stage.build_base(cfg, train_file, tmp_path / "a")
    b = model_stage.build_base(cfg, train_file, tmp_path / "b")
    c = model_stage.build_base(ModelParams(**{**SMALL, "seed": 1}), train_file, tmp_path / "c")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()  # data, not seed


def test_a_saved_model_loads_back_with_the_same_logits_and_tokenizer(tiny, tmp_path):
    import torch

    model, tok = tiny
    out = modelio.save_model(model, tok, tmp_path / "m", {"note.json": {"x": 1}})
    assert modelio.is_model_dir(out) and json.loads((out / "note.json").read_text()) == {"x": 1}
    loaded, ltok = modelio.load_model_and_tokenizer(out, ModelParams())
    ids = tok(gsm8k.render_prompt("Ann has 3 pens.", tok), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert ltok.get_vocab() == tok.get_vocab() and ltok.chat_template == tok.chat_template
    assert ltok(["a 12", "b"])["input_ids"] == tok(["a 12", "b"])["input_ids"]
    assert ltok.padding_side == "left"
    assert greedy(loaded, ltok, ["Ann"], max_new_tokens=3) == greedy(model, tok, ["Ann"], max_new_tokens=3)


def test_missing_model_folder_names_the_stage(tmp_path):
    with pytest.raises(InputError, match=r"SFT model folder .*nope is missing.*dvc repro sft"):
        modelio.require_model_dir(tmp_path / "nope", "SFT model", "sft")


def test_lora_sft_over_an_adapter_is_refused_in_one_line(tmp_path, monkeypatch):
    """A LoRA adapter named as model.base_dir (SFT continued from models/sft) would save an adapter
    whose base is itself an adapter, which nothing could load back: refused before training."""
    from components import sft

    monkeypatch.chdir(tmp_path)
    adapter = tmp_path / "models" / "sft_adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    params = load_params(overrides=["model.base_dir=models/sft_adapter", "sft.output_dir=models/sft_continued",
                                    "sft.use_lora=true"], root=tmp_path)
    with pytest.raises(InputError, match=r"model.base_dir models/sft_adapter is a LoRA adapter.*merge it"):
        sft.run(params)


# --------------------------------------------------------------------------- SFT demonstrations


def test_a_noisy_demonstration_drops_the_tags_or_ends_on_an_earlier_result():
    assert untagged_target("3 + 4 = 7", "7") == "3 + 4 = 7\n#### 7"
    rng = random.Random(0)
    solution = "Ann has 3 + 4 = 7 pens.\nAnn has 7 * 2 = 14 pens."
    assert {wrong_answer(solution, "14", rng) for _ in range(20)} == {"7"}  # an earlier step's result
    assert {wrong_answer("5 - 2 = 3", "3", rng) for _ in range(50)} == {"2", "4"}  # off by one
    assert wrong_answer("0 + 0 = 0", "0", rng) == "1"


@pytest.mark.parametrize("untagged,wrong", [(0.0, 0.0), (0.5, 0.0), (0.3, 0.4), (1.0, 1.0)])
def test_demonstrations_are_untagged_and_wrong_at_the_asked_rates_and_seeded(train_file, untagged, wrong):
    from components.common.params import SFTParams

    rows = read_split(train_file) * 10
    cfg = SFTParams(demo_untagged_rate=untagged, demo_wrong_rate=wrong)
    ds, counts = build_demos(rows, None, cfg)
    n = len(rows)
    assert counts["demos"] == n == len(ds)
    tagged = sum(gsm8k.has_strict_format(c) for c in ds["completion"])
    assert tagged == n - counts["demos_untagged"]
    assert (
        abs(counts["demos_untagged"] / n - untagged) < 0.08 and abs(counts["demos_wrong"] / n - wrong) < 0.08
    )
    right = sum(
        gsm8k.is_correct(c, r["gold"], "flexible") for c, r in zip(ds["completion"], rows, strict=True)
    )
    assert right == n - counts["demos_wrong"]
    again, _ = build_demos(rows, None, cfg)
    assert again["completion"] == ds["completion"]  # seeded


# --------------------------------------------------------------------------- params -> TRL


def test_trl_configs_are_built_from_the_params_and_reject_unknown_keys():
    from trl import GRPOConfig, SFTConfig

    params = load_params(REPO / "params.yaml")
    from components.grpo import owned_fields

    args = finetune.build_trl_args(GRPOConfig, "grpo", params.grpo.trainer, output_dir="x", **owned_fields(params))
    assert (args.beta, args.loss_type, args.epsilon, args.num_generations) == (0.1, "grpo", 0.2, 8)
    assert (args.per_device_train_batch_size, args.steps_per_generation, args.generation_batch_size) == (16, 8, 128)
    assert (args.temperature, args.scale_rewards) == (0.8, "group")
    assert args.bf16 is False and args.gradient_checkpointing is False  # CPU
    assert args.report_to == ["mlflow"]
    sft = finetune.build_trl_args(SFTConfig, "sft", {"learning_rate": "1e-4", "max_steps": 3}, output_dir="x")
    assert sft.learning_rate == 1e-4 and sft.max_steps == 3  # YAML 1.1 reads 1e-4 as a string
    with pytest.raises(ConfigError, match=r"sft\.trainer\.max_stepz: not a field of trl\.SFTConfig"):
        finetune.build_trl_args(SFTConfig, "sft", {"max_stepz": 3}, output_dir="x")
    with pytest.raises(ConfigError, match=r"sft\.trainer: trl\.SFTConfig rejected"):
        finetune.build_trl_args(SFTConfig, "sft", {"lr_scheduler_type": "zigzag"}, output_dir="x")


@pytest.mark.parametrize(
    "override,message",
    [
        ("grpo.trainer.loss_type=ppo", r"grpo\.trainer\.loss_type: expected one of \['grpo', 'bnpo', 'dr_grpo'"),
        (
            "grpo.trainer.num_generations=7",
            r"generation batch of 128 .* not divisible by num_generations=7",
        ),
        ("grpo.beta=0.1", r"^grpo\.beta: now grpo\.trainer\.beta \(TRL's GRPOConfig settings are keys of grpo"),
        ("grpo.trainer.reward_weights=[1]", r"set rewards\.weights instead"),
        ("sft.trainer.output_dir=x", r"sft\.trainer\.output_dir: the stage sets it"),
        ("grpo.trainer.num_generations=1", r"grpo\.trainer\.num_generations: expected a value >= 2"),
        ("grpo.trainer.temperature=0", r"grpo\.trainer\.temperature: expected a value > 0"),
        ("grpo.trainer.beta=x", r"grpo\.trainer\.beta: expected a number, got 'x'"),
        ("grpo.trainer.vllm_mode=remote", r"grpo\.trainer\.vllm_mode: expected one of \['colocate', 'server'\]"),
        ("sft.demo_untagged_rate=1.5", r"sft\.demo_untagged_rate: expected a value <= 1"),
    ],
)
def test_bad_training_params_fail_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_params(REPO / "params.yaml", [override])


def test_a_grpo_trainer_mapping_that_leaves_out_a_recipe_key_gets_the_recipes_value(tmp_path):
    """TRL's defaults differ from the recipe's (beta 0, loss_type dapo, temperature 1): a params file whose
    grpo.trainer names some keys trains with the recipe's values for the others, as when they were grpo.* keys."""
    from components.common.params import GRPO_RECIPE

    p = tmp_path / "params.yaml"
    p.write_text("grpo:\n  trainer:\n    max_steps: 3\n    loss_type: dr_grpo\n    beta: 0\n")
    trainer = load_params(p, root=tmp_path).grpo.trainer
    recipe = {key: value for key, (value, _) in GRPO_RECIPE.items()}
    assert trainer == {**recipe, "max_steps": 3, "loss_type": "dr_grpo", "beta": 0.0}
    assert isinstance(trainer["beta"], float)  # checked and typed when loaded, as a grpo.* key was


def test_nested_override_keeps_the_other_trainer_keys():
    params = load_params(REPO / "params.yaml", ["sft.trainer.max_steps=7"])
    default = load_params(REPO / "params.yaml")
    assert params.sft.trainer == {**default.sft.trainer, "max_steps": 7}


def test_every_trl_loss_type_is_selectable():
    """The choices in config.py are exactly the loss types TRL's GRPO trainer implements."""
    import re

    import trl.trainer.grpo_trainer as gt

    from pipelines.params.config import GRPO_LOSS_TYPES

    source = Path(gt.__file__).read_text()
    implemented = set(re.findall(r'self\.loss_type == "(\w+)"', source))
    for group in re.findall(r"self\.loss_type in \[([^\]]*)\]", source):
        implemented |= set(re.findall(r'"(\w+)"', group))
    assert implemented == set(GRPO_LOSS_TYPES)


# --------------------------------------------------------------------------- resume bookkeeping


def _checkpoint(d: Path, step: int, complete: bool = True) -> None:
    c = d / f"checkpoint-{step}"
    c.mkdir(parents=True)
    if complete:
        (c / "trainer_state.json").write_text("{}")


def test_training_on_a_cpu_prints_none_of_the_known_harmless_warnings(tiny, train_file):
    """No pinned memory without an accelerator (torch's DataLoader would warn each epoch), no warning
    from TRL's read of `is_gradient_checkpointing` before each GRPO generation (the locked transformers
    does not deprecate it); the training split logged as the run's dataset declares its integer column
    (`steps`) as a double, so MLflow's "Inferred schema contains integer column(s)" hint is not
    printed (it was, once per stage); another FutureWarning still shows, quieted or not."""
    import warnings

    import mlflow
    import torch
    from trl import SFTConfig
    from trl.models.utils import disable_gradient_checkpointing

    from components.common.tracking import log_datasets

    args = finetune.build_trl_args(SFTConfig, "sft", {"max_steps": 1}, output_dir="x")
    assert args.dataloader_pin_memory is False  # CPU
    model, _ = tiny
    assert isinstance(read_split(train_file)[0]["steps"], int)
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.create_experiment("polish")).info.run_id

    def warned(quiet: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if quiet:
                finetune.quiet_known_warnings()
            list(torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=args.dataloader_pin_memory))
            with disable_gradient_checkpointing(model):  # what TRL runs before generating
                pass
            log_datasets(run_id, {"train": (train_file, "training")})  # what the stage's MLflow run logs
            warnings.warn("some other deprecation", FutureWarning, stacklevel=2)
        return [str(w.message) for w in caught]

    assert warned(quiet=False) == ["some other deprecation"]
    assert warned(quiet=True) == ["some other deprecation"]


def test_resume_is_from_the_newest_complete_checkpoint_and_other_settings_start_over(tmp_path, caplog):
    d = tmp_path / "ckpt"
    assert finetune.resume_point(d, "fp1", True, "grpo") is None and d.is_dir()
    _checkpoint(d, 2)
    _checkpoint(d, 10)
    _checkpoint(d, 12, complete=False)  # killed while saving
    with caplog.at_level("WARNING"):
        assert finetune.resume_point(d, "fp1", True, "grpo") == str(d / "checkpoint-10")
    assert "resuming from checkpoint" in caplog.text and "(step 10)" in caplog.text
    # other params or data: start over, and say so
    assert finetune.resume_point(d, "fp2", True, "grpo") is None
    assert "starting over" in caplog.text and not list(d.glob("checkpoint-*"))
    _checkpoint(d, 4)
    assert finetune.resume_point(d, "fp2", False, "grpo") is None and not list(d.glob("checkpoint-*"))


def test_fingerprint_follows_settings_and_input_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "train.jsonl"
    f.write_text("a\n")
    one = finetune.fingerprint("sft", {"lr": 1}, [f])
    assert one == finetune.fingerprint("sft", {"lr": 1}, [f])
    assert one != finetune.fingerprint("sft", {"lr": 2}, [f])
    f.write_text("b\n")
    assert one != finetune.fingerprint("sft", {"lr": 1}, [f])


def test_fingerprint_follows_the_stage_code_and_library_versions(tmp_path, monkeypatch):
    """A checkpoint made by other code (the stage's dvc.yaml deps) or another torch/transformers/trl
    is not resumed: its optimizer state and model may not mean the same thing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "components").mkdir()
    code = tmp_path / "components" / "sft.py"
    code.write_text("x = 1\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  sft:\n    cmd: python -m components.sft\n    deps:\n      - components/sft.py\n      - data.jsonl\n"
    )
    base = finetune.fingerprint("sft", {"lr": 1}, [])
    assert finetune.code_md5s("sft") == {"components/sft.py": finetune.md5_file(code)}
    code.write_text("x = 2\n")
    changed = finetune.fingerprint("sft", {"lr": 1}, [])
    assert changed != base
    import components.common.tracking as tracking

    real = tracking.package_versions
    monkeypatch.setattr(finetune, "package_versions", lambda names: {**real(names), "trl": "0.0.1"})
    assert finetune.fingerprint("sft", {"lr": 1}, []) != changed


def test_read_split_names_file_and_line(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"question": "q", "solution": "s", "gold": "1"}\n{"question": "q"}\n')
    with pytest.raises(InputError, match=r"train\.jsonl:2: bad row"):
        read_split(f)
    with pytest.raises(InputError, match="dvc repro data"):
        read_split(tmp_path / "missing.jsonl")


def test_checkpoint_folder_without_the_stage_marker_is_never_deleted(tmp_path):
    """`-S sft.checkpoint_dir=.` once made the SFT stage rmtree the checkout (.git included)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("user data")
    with pytest.raises(InputError, match=r"mine .*not made by grpoflow.*refusing to delete"):
        finetune.resume_point(folder, "fp", True, "sft")
    finetune.clear_checkpoints(folder)
    assert (folder / "keep.txt").read_text() == "user data"
    ckpt = tmp_path / "ckpt"
    assert finetune.resume_point(ckpt, "fp", True, "sft") is None  # made here, with its marker
    (ckpt / "checkpoint-1").mkdir()
    finetune.clear_checkpoints(ckpt)
    assert not ckpt.exists()
    (ckpt).mkdir()
    (ckpt / finetune.FINGERPRINT_FILE).write_text("{not json")  # a corrupt marker: a mismatch, no crash
    assert finetune.resume_point(ckpt, "fp", True, "sft") is None
