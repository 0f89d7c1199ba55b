"""params.yaml loading: defaults, -S overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from pipelines.params.config import SECTIONS, ConfigError, Params, load_params, parse_override, read_help

REPO = Path(__file__).resolve().parents[1]
HELP = read_help((REPO / "params.yaml").read_text())
FIELDS = [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def test_repo_params_load_and_match_dataclass_defaults():
    """params.yaml spells out every field of the schema (components/common/params.py) with the value the
    code uses when the key is left out: a value changed in one place and not the other fails here."""
    params = load_params(REPO / "params.yaml")
    defaults = Params(**{name: cls() for name, cls in SECTIONS.items()})  # the fields' own defaults
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set(raw) == set(SECTIONS)
    for name, cls in SECTIONS.items():
        assert isinstance(getattr(params, name), cls)
        assert set(raw[name]) == {f.name for f in dataclasses.fields(cls)}, name
    differ = {f"{name}.{key}": (value, getattr(getattr(defaults, name), key))
              for name, section in params.to_dict().items() for key, value in section.items()
              if value != getattr(getattr(defaults, name), key)}
    assert differ == {}, "params.yaml value, code default"


def test_config_command_explains_every_key_as_yaml():
    """`python -m pipelines.params.config` prints the effective params as YAML (what the slow tests and a
    user's script parse), each key preceded by its help text as a comment."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pipelines.params.config", "-S", "grpo.trainer.beta=0.0",
         "-S", "sft.trainer.max_steps=7"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    expected = load_params(None, ["grpo.trainer.beta=0.0", "sft.trainer.max_steps=7"])
    assert yaml.safe_load(out) == expected.to_dict()
    assert read_help(out) == HELP  # every section and key with the help params.yaml gives it
    assert HELP["grpo.trainer.beta"].startswith("KL coefficient")  # and an entry of a mapping with its own


def test_fingerprint_leaves_out_the_keys_marked_so():
    """Keys marked fingerprint=False (paths, resume, sample_size, the GRPO monitor) do not change the
    resume fingerprint of a training stage; a training key does."""
    from components import grpo, sft

    base = load_params(None)
    assert (sft.fingerprint_settings(load_params(None, ["sft.sample_size=3", "sft.resume=false"]))
            == sft.fingerprint_settings(base))
    assert grpo.fingerprint_settings(load_params(None, ["grpo.signal_window=7"])) == grpo.fingerprint_settings(base)
    assert (sft.fingerprint_settings(load_params(None, ["sft.trainer.learning_rate=0.1"]))
            != sft.fingerprint_settings(base))
    assert grpo.fingerprint_settings(load_params(None, ["grpo.trainer.beta=0.0"])) != grpo.fingerprint_settings(base)


def test_every_params_key_has_its_help_in_the_comment_block_above_it():
    """Each field of the schema has a help paragraph above its key in params.yaml, every key there is a
    field, in the schema's order, and no key line carries a second, inline explanation."""
    keys = [k for k in HELP if k.count(".") == 1]
    assert keys == FIELDS, "params.yaml keys and the schema's fields differ (or are in another order)"
    assert [k for k in FIELDS if not HELP[k].strip()] == [], "fields without a help comment in params.yaml"
    for line in (REPO / "params.yaml").read_text().splitlines():
        if re.match(r"^ {0,2}\w+:", line):
            assert "#" not in line, f"params.yaml: the help goes in the comment block above the key: {line!r}"


def test_the_help_check_fails_on_a_key_without_help():
    text = (REPO / "params.yaml").read_text().replace("  # Seed of the synthetic generator",
                                                      "  seedless: 0\n  # Seed of", 1)
    assert read_help(text)["data.seedless"] == ""


def test_help_text_is_no_field_metadata():
    """Help lives in params.yaml's comments only, so editing a sentence changes no stage's code dep."""
    for cls in SECTIONS.values():
        assert [f.name for f in dataclasses.fields(cls) if "help" in f.metadata] == []


def test_every_remote_override_pattern_names_a_key():
    """REMOTE_OVERRIDES follows the schema: a pattern that matches no key (a renamed field) is an error."""
    import fnmatch

    from pipelines.params.overrides import REMOTE_OVERRIDES

    keys = [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    mappings = {f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)
                if f.default_factory is not dataclasses.MISSING and isinstance(f.default_factory(), dict)}
    unknown = [p for p in REMOTE_OVERRIDES if not any(fnmatch.fnmatchcase(k, p) for k in keys)
               and not any(p.startswith(m + ".") for m in mappings)]
    assert unknown == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.nope=1", r"data\.nope: unknown key; known keys of 'data':"),
        ("nosection.key=1", r"unknown section 'nosection'"),
        ("data.seed=abc", r"data\.seed: expected an integer, got 'abc'"),
        ("data.seed=-1", r"data\.seed: expected a value >= 0, got -1"),
        ("data.on_bad_rows=ignore", r"data\.on_bad_rows: expected one of \['fail', 'skip'\]"),
        ("data.allow_overlap=maybe", r"data\.allow_overlap: expected true or false"),
        ("data.train_source=csv:x", r"data\.train_source: expected 'synthetic', 'jsonl:PATH'"),
        ("data.seed", r"expected section\.key=value"),
        ("model.tiny_num_heads=3", r"model\.tiny_num_heads: 3 does not divide"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_params(REPO / "params.yaml", [override])


def test_overrides_are_yaml_typed():
    params = load_params(REPO / "params.yaml", ["data.seed=7", "data.allow_overlap=true", "data.output_dir=x/y"])
    assert params.data.seed == 7 and params.data.allow_overlap is True and params.data.output_dir == "x/y"
    assert parse_override("rewards.weights=[1, 0.5]") == ("rewards", "weights", [1, 0.5])


def test_an_unknown_key_or_section_in_the_params_file_is_named(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("data:\n  sed: 1\n")
    with pytest.raises(ConfigError, match=r"data\.sed: unknown key"):
        load_params(p)
    p.write_text("datta:\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"unknown section 'datta'"):
        load_params(p)


def test_missing_params_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")


def test_int_accepted_for_float_but_bool_rejected_for_int():
    from components.common.params_rules import coerce as _coerce

    assert _coerce("k", 1, float) == 1.0
    with pytest.raises(ConfigError):
        _coerce("k", True, int)


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "override,message",
    [
        ("sft.checkpoint_dir=.", r"sft\.checkpoint_dir: '\.' is the repository root"),
        ("sft.checkpoint_dir=data", r"sft\.checkpoint_dir: 'data' .*overlaps data\.output_dir"),
        ("sft.checkpoint_dir=/tmp/x", r"sft\.checkpoint_dir: '/tmp/x' resolves to /tmp/x, outside the repository"),
        ("sft.checkpoint_dir=..", r"sft\.checkpoint_dir: '\.\.' resolves to .*outside the repository"),
        ("grpo.output_dir=.git/x", r"grpo\.output_dir: '\.git/x' is inside \.git"),
        ("evaluate.output_dir=.dvc", r"evaluate\.output_dir: '\.dvc' is inside \.dvc"),
        ("sft.output_dir=models", r"sft\.output_dir: 'models' .*overlaps model\.base_dir"),
        ("grpo.checkpoint_dir=models/grpo/ckpt", r"grpo\.checkpoint_dir: .*overlaps grpo\.output_dir"),
        ("model.base_dir=data/base", r"model\.base_dir: 'data/base' .*overlaps the data folder"),
        ("grpo.init_dir=../elsewhere", r"grpo\.init_dir: .*outside the repository"),
        ("sft.metrics_file=/etc/passwd", r"sft\.metrics_file: '/etc/passwd' resolves to .*outside the repository"),
    ],
)
def test_paths_that_could_delete_user_data_are_rejected(tmp_path, override, message):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    with pytest.raises(ConfigError, match=message):
        load_params(tmp_path / "params.yaml", [override])


def test_default_and_ordinary_paths_pass(tmp_path):
    """The defaults and ordinary paths (a relative one, an absolute one inside the repository) load as given and
    resolve inside the params file's folder."""
    from components.common.path_safety import check_paths

    root = tmp_path.resolve()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    default = load_params(root / "params.yaml")
    assert check_paths(default, root)["sft.checkpoint_dir"] == root / default.sft.checkpoint_dir
    params = load_params(root / "params.yaml", ["sft.checkpoint_dir=scratch/sft", f"grpo.output_dir={root}/out/grpo"])
    assert (params.sft.checkpoint_dir, params.grpo.output_dir) == ("scratch/sft", f"{root}/out/grpo")
    resolved = check_paths(params, root)
    assert (resolved["sft.checkpoint_dir"], resolved["grpo.output_dir"]) == (root / "scratch/sft", root / "out/grpo")
    assert all(root in p.parents for p in resolved.values())


@pytest.mark.parametrize(
    "override,ok",
    [
        ("grpo.trainer.beta=0.0", True), ("sft.trainer.max_steps=5", True), ("data.seed=7", True),
        ("data.train_source=hf:openai/gsm8k:main", True), ("rewards.funcs=[accuracy, format]", True),
        ("model.trust_remote_code=true", False), ("sft.checkpoint_dir=x", False), ("grpo.init_dir=x", False),
        ("evaluate.vllm_python=/bin/sh", False), ("evaluate.vllm_args.load_format=pt", False),
        ("sft.trainer.push_to_hub=true", False), ("tracking.uri=http://elsewhere", False),
        ("data.train_source=jsonl:/etc/passwd", False), ("rewards.funcs=[mypkg.mod:reward]", False),
        ("sft.metrics_file=x.json", False), ("grpo.trainer.use_vllm=true", False),
    ],
)
def test_remote_runs_may_only_override_the_allow_list(override, ok):
    from pipelines.params.config import check_remote_overrides

    if ok:
        check_remote_overrides([override])
    else:
        with pytest.raises(ConfigError, match="remote run"):
            check_remote_overrides([override])


def test_an_old_key_is_one_line_naming_its_new_name(tmp_path):
    """TRL's GRPOConfig settings moved from grpo.* to grpo.trainer.*: the old key on the command line, in a
    params file or in a remote run's overrides fails naming the new one (exit 2, one line, no traceback)."""
    import subprocess
    import sys

    from pipelines.params.config import check_remote_overrides

    proc = subprocess.run([sys.executable, "-m", "pipelines.params.config", "-S", "grpo.beta=0.1"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: grpo.beta: now grpo.trainer.beta (TRL's GRPOConfig settings are keys of grpo.trainer); "
        "set grpo.trainer.beta instead"]
    (tmp_path / "params.yaml").write_text("grpo:\n  loss_type: dr_grpo\n")
    with pytest.raises(ConfigError, match=r"^grpo\.loss_type: now grpo\.trainer\.loss_type "):
        load_params(tmp_path / "params.yaml")
    with pytest.raises(ConfigError, match=r"grpo\.num_generations is now grpo\.trainer\.num_generations"):
        check_remote_overrides(["grpo.num_generations=4"])


def test_params_yaml_is_parsed_once_per_content(tmp_path, monkeypatch):
    """A process that loads the same params file again (the CLI, the run lock, the flow) parses it once;
    a rewritten file is parsed again, and no caller shares another's objects."""
    from components.common import params_load

    parsed = []
    real = params_load.yaml.safe_load
    monkeypatch.setattr(params_load.yaml, "safe_load", lambda text: parsed.append(text) or real(text))
    p = tmp_path / "params.yaml"
    p.write_text("data:\n  seed: 1\n  output_dir: d\n")
    a, b = load_params(p), load_params(p)
    assert a.data.seed == b.data.seed == 1 and len(parsed) == 1
    a.data.seed = 5
    assert load_params(p).data.seed == 1
    p.write_text("data:\n  seed: 2\n  output_dir: d\n")
    assert load_params(p).data.seed == 2 and len(parsed) == 2


def append_to_every_help_entry(params_file: Path, word: str) -> None:
    """Append ` word` to the help of every key of a params.yaml, and of every mapping entry with help of its own
    (the last comment line above each)."""
    lines = params_file.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines[1:], 1):
        if re.match(r"^( {0,2}| {4})\w+:", line) and lines[i - 1].lstrip().startswith("#"):
            lines[i - 1] = f"{lines[i - 1].rstrip()} {word}\n"
    params_file.write_text("".join(lines))


def test_editing_help_text_reruns_no_stage(tmp_path):
    """On a small checkout of the project (pipelines/ included, as in a user's clone) after a run of the
    data and model stages, a word appended to every param's help text leaves `dvc status` clean, while
    a comment in a module the data stage imports makes it report exactly that stage."""
    import json
    import os
    import subprocess
    import sys

    from tests.project_repo import make_project_repo

    repo = make_project_repo(tmp_path / "repo", with_flows=True)
    env = {**os.environ, "PYTHONPATH": "",  # the stages run the checkout's code
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}

    def dvc(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True,
                              text=True, check=True).stdout

    def status() -> dict:
        return json.loads(dvc("status", "--json", "data", "model"))

    dvc("repro", "data", "model")
    assert status() == {}
    whole = dvc("status", "--json")  # the stages that did not run: what they lack, before the edit

    append_to_every_help_entry(repo / "params.yaml", "indeed")
    edited = read_help((repo / "params.yaml").read_text())
    assert edited.keys() == HELP.keys() and all(edited[k] == f"{HELP[k]} indeed" for k in HELP if HELP[k])
    assert status() == {}
    assert dvc("status", "--json") == whole

    with open(repo / "components/problems/synthetic.py", "a") as fh:
        fh.write("# a comment\n")
    assert list(status()) == ["data"]
