"""Stage data: sources, validation, overlap, atomic output and a real DVC round trip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.data import DataError, write_splits
from pipelines.params.config import DataParams, load_params

REPO = Path(__file__).resolve().parents[1]

GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "to friends in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A company pays $1,000 a month. How much is that a year?",
        "answer": "12 * 1000 = <<12*1000=12000>>12,000\n#### 12,000",
    },
    {"question": "Ann had $3.50 and spent $1. How much is left?", "answer": "3.50-1=<<3.50-1=2.50>>2.50\n#### $2.50"},
]
TEST_ROWS = [{"question": "What is 2 + 3?", "answer": "2+3=<<2+3=5>>5\n#### 5"}]


def write_jsonl(path: Path, rows, raw_lines=()) -> Path:
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def read_jsonl(path: Path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def cfg(tmp_path: Path, **kw) -> DataParams:
    base = dict(
        train_source=f"jsonl:{write_jsonl(tmp_path / 'train.jsonl', GSM8K_ROWS)}",
        test_source=f"jsonl:{write_jsonl(tmp_path / 'test.jsonl', TEST_ROWS)}",
        output_dir=str(tmp_path / "out"),
    )
    base.update(kw)
    return DataParams(**base)


def test_jsonl_source_converts_gsm8k_rows(tmp_path):
    stats = write_splits(cfg(tmp_path))
    rows = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert [r["gold"] for r in rows] == ["72", "12000", "2.5"]
    assert rows[0]["solution"].startswith("Natalia sold 48/2 = 24 clips in May.")
    assert "<<" not in "".join(r["solution"] for r in rows)
    assert "####" not in "".join(r["solution"] for r in rows)
    assert rows[0]["id"] == "train-1" and set(rows[0]) == {"id", "question", "solution", "gold", "steps"}
    assert stats["counts"] == {"train": 3, "test": 1}
    import hashlib

    for name in ("train.jsonl", "test.jsonl"):
        digest = hashlib.sha256((tmp_path / "out" / name).read_bytes()).hexdigest()
        assert stats["sha256"][name] == digest
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats


def test_synthetic_is_seeded_disjoint_and_in_gsm8k_format(tmp_path):
    c = DataParams(synthetic_train_size=300, synthetic_test_size=100, synthetic_test_top_band_size=0,
                   output_dir=str(tmp_path / "a"))
    write_splits(c)
    first = (tmp_path / "a" / "train.jsonl").read_bytes()
    c2 = DataParams(synthetic_train_size=300, synthetic_test_size=100, output_dir=str(tmp_path / "b"))
    write_splits(c2)
    assert (tmp_path / "b" / "train.jsonl").read_bytes() == first
    c3 = DataParams(synthetic_train_size=300, synthetic_test_size=100, seed=99, output_dir=str(tmp_path / "c"))
    write_splits(c3)
    assert (tmp_path / "c" / "train.jsonl").read_bytes() != first
    train = read_jsonl(tmp_path / "a" / "train.jsonl")
    test = read_jsonl(tmp_path / "a" / "test.jsonl")
    assert len(train) == 300 and len(test) == 100
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    # The raw generator writes GSM8K's own answer format; the gold answer is the last step's result.
    import random

    from components.problems.synthetic import synthetic_problem

    prob = synthetic_problem(random.Random(0))
    assert "<<" in prob["answer"] and prob["answer"].splitlines()[-1].startswith("#### ")
    for r in train[:50]:
        assert r["solution"].splitlines()[-1].split("= ")[-1].split()[0] == r["gold"]


@pytest.mark.parametrize("seed", [1234, 5, 4242])
def test_the_default_test_split_sizes_its_target_band_to_show_an_8_point_gain(tmp_path, seed):
    """The default test split: at least 250 problems of the 3-step target band on any seed (where a
    real +8 points is significant), at least 250 in the demonstrated bands, and its first
    synthetic_test_size problems the ones a split without the top band holds."""
    defaults = DataParams()  # params.yaml's data section (tests/test_config.py)
    write_splits(DataParams(**{**defaults.__dict__, "seed": seed, "output_dir": str(tmp_path / "a")}))
    write_splits(DataParams(**{**defaults.__dict__, "seed": seed, "synthetic_test_top_band_size": 0,
                               "output_dir": str(tmp_path / "b")}))
    test, plain = read_jsonl(tmp_path / "a" / "test.jsonl"), read_jsonl(tmp_path / "b" / "test.jsonl")
    bands = {steps: sum(r["steps"] == steps for r in test) for steps in (1, 2, 3)}
    assert bands[3] >= 250 and bands[1] + bands[2] >= 250, bands
    assert len(test) == defaults.synthetic_test_size + defaults.synthetic_test_top_band_size
    assert test[: len(plain)] == plain and {r["steps"] for r in test[len(plain):]} == {3}
    assert len({r["question"] for r in test}) == len(test)


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ("{not json", "invalid JSON"),
        (json.dumps({"answer": "1\n#### 1"}), "field 'question' is missing"),
        (json.dumps({"question": "Q", "answer": "   "}), "field 'answer' is empty"),
        (json.dumps({"question": "Q", "answer": "no final answer"}),
         "field 'answer' has no '#### <number>' final answer"),
        (json.dumps({"question": "Q", "answer": "x\n#### seven"}),
         "field 'answer': final answer 'seven' is not a number"),
        (json.dumps({"question": 5, "answer": "x\n#### 7"}), "field 'question' must be a string"),
        (json.dumps(["q", "a"]), "expected a JSON object"),
    ],
)
def test_bad_rows_fail_with_file_line_and_leave_outputs(tmp_path, bad_line, reason):
    good = cfg(tmp_path)
    write_splits(good)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    bad_file = write_jsonl(tmp_path / "bad.jsonl", GSM8K_ROWS, [bad_line])
    with pytest.raises(DataError) as err:
        write_splits(cfg(tmp_path, train_source=f"jsonl:{bad_file}"))
    assert f"{bad_file}:4: {reason}" in str(err.value)
    assert "1 bad row(s)" in str(err.value)
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_skip_mode_drops_and_counts(tmp_path):
    bad_file = write_jsonl(tmp_path / "bad.jsonl", GSM8K_ROWS, ["{oops", json.dumps({"question": "Q"})])
    stats = write_splits(cfg(tmp_path, train_source=f"jsonl:{bad_file}", on_bad_rows="skip"))
    assert stats["counts"]["train"] == 3
    assert stats["dropped"]["train"]["count"] == 2
    assert stats["dropped"]["train"]["rows"][0].startswith(f"{bad_file}:4: invalid JSON")


def test_many_bad_rows_are_counted(tmp_path):
    bad_file = write_jsonl(tmp_path / "bad.jsonl", [], ["{x"] * 25)
    with pytest.raises(DataError, match=r"25 bad row\(s\)[\s\S]*and 15 more"):
        write_splits(cfg(tmp_path, train_source=f"jsonl:{bad_file}"))


def test_overlap_fails_unless_allowed(tmp_path):
    test_file = write_jsonl(
        tmp_path / "t.jsonl", [{"question": "  natalia SOLD clips to 48 of her friends in April, and then she sold "
                                "half as many clips to friends in May.   How many clips did Natalia sell "
                                "altogether in April and May?", "answer": "#### 72"}]
    )
    with pytest.raises(DataError, match=r"train\.jsonl:1: question also in the test split at .*t\.jsonl:1"):
        write_splits(cfg(tmp_path, test_source=f"jsonl:{test_file}"))
    assert not (tmp_path / "out").exists()
    stats = write_splits(cfg(tmp_path, test_source=f"jsonl:{test_file}", allow_overlap=True))
    assert stats["counts"] == {"train": 3, "test": 1}


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        write_splits(cfg(tmp_path, train_source=f"jsonl:{tmp_path / 'nope.jsonl'}"))


def test_an_hf_source_reads_a_saved_dataset_and_a_folder_of_files(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(GSM8K_ROWS), "test": datasets.Dataset.from_list(TEST_ROWS)}
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    # Files in a folder go through datasets.load_dataset, the same call that reads the hub.
    (tmp_path / "files").mkdir()
    write_jsonl(tmp_path / "files" / "train.jsonl", GSM8K_ROWS)
    write_jsonl(tmp_path / "files" / "test.jsonl", TEST_ROWS)
    for src in (f"hf:{tmp_path / 'saved'}", f"hf:{tmp_path / 'files'}"):
        out = tmp_path / ("out-" + Path(src).name)
        stats = write_splits(DataParams(train_source=src, test_source=src, output_dir=str(out)))
        assert stats["counts"] == {"train": 3, "test": 1}
        assert [r["gold"] for r in read_jsonl(out / "train.jsonl")] == ["72", "12000", "2.5"]


def test_hf_hub_unreachable_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"hf:openai/gsm8k:main: could not load split 'test'"):
        write_splits(DataParams(train_source="synthetic", test_source="hf:openai/gsm8k:main",
                                output_dir=str(tmp_path / "o")))


def test_cli_reports_file_line_and_exit_code(tmp_path):
    bad_file = write_jsonl(tmp_path / "bad.jsonl", GSM8K_ROWS, ['{"question": "Q", "answer": "x\\n#### ?"}'])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("previous")
    proc = subprocess.run(
        [sys.executable, "-m", "components.data", "-S", f"data.train_source=jsonl:{bad_file}",
         "-S", f"data.test_source=jsonl:{write_jsonl(tmp_path / 't.jsonl', TEST_ROWS)}",
         "-S", f"data.output_dir={out}"],
        cwd=tmp_path, capture_output=True, text=True,  # the checkout: stage paths must lie inside it
    )
    assert proc.returncode == 2
    assert f"{bad_file}:4: field 'answer': final answer '?' is not a number" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = ""
    return env


def test_dvc_repro_skip_push_pull_round_trip(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for item in ("components", "params.yaml", "dvc.yaml"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, repo / item)
    env = _env(tmp_path)

    def sh(*cmd):
        return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, check=True).stdout

    sh("git", "init", "-q")
    sh("dvc", "init", "-q")
    sh("dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    # Keep the stage small and only the data stage.
    params = (repo / "params.yaml").read_text().replace("synthetic_train_size: 4000", "synthetic_train_size: 200")
    (repo / "params.yaml").write_text(params)
    out = sh("dvc", "repro", "data")
    assert "Running stage 'data'" in out
    assert "didn't change, skipping" in sh("dvc", "repro", "data")
    train = (repo / "data/processed/train.jsonl").read_bytes()
    sh("dvc", "push", "data")
    shutil.rmtree(repo / "data/processed")
    shutil.rmtree(repo / ".dvc/cache")
    sh("dvc", "pull", "data")
    assert (repo / "data/processed/train.jsonl").read_bytes() == train
    # A params change re-runs the stage.
    (repo / "params.yaml").write_text(params.replace("seed: 1234", "seed: 4321"))
    assert "Running stage 'data'" in sh("dvc", "repro", "data")
    assert (repo / "data/processed/train.jsonl").read_bytes() != train


def test_synthetic_difficulty_params_bound_both_splits(tmp_path):
    import re

    c = DataParams(
        synthetic_train_size=200,
        synthetic_test_size=50,
        synthetic_max_steps=1,
        synthetic_max_number=5,
        synthetic_test_max_steps=0,  # the test split in the same band
        output_dir=str(tmp_path / "easy"),
    )
    write_splits(c)
    for split in ("train", "test"):
        for row in read_jsonl(tmp_path / "easy" / f"{split}.jsonl"):
            assert len(row["solution"].splitlines()) == 1  # one step
            start = int(re.search(r"has (\d+)", row["question"]).group(1))
            bought = [int(b) for b in re.findall(r"buys (\d+)", row["question"])]
            assert 2 <= start <= 5 and all(1 <= b <= 5 for b in bought)


def test_synthetic_generator_defaults_draw_the_original_stream():
    import random

    from components.problems.synthetic import synthetic_problem

    a, b = random.Random(7), random.Random(7)
    assert [synthetic_problem(a) for _ in range(50)] == [synthetic_problem(b, 3, 20) for _ in range(50)]


def synthetic_cfg(tmp_path: Path, **kw) -> DataParams:
    return DataParams(**{"synthetic_train_size": 200, "synthetic_test_size": 100, "synthetic_max_steps": 2,
                         "output_dir": str(tmp_path / "out"), **kw})


def steps(row: dict[str, str]) -> int:
    """A synthetic problem's number of steps: one sentence per step between the start and the question."""
    return row["question"].count(".") - 1


def test_grpo_split_is_the_demonstrations_questions_without_answer_only_problems(tmp_path):
    stats = write_splits(synthetic_cfg(tmp_path, synthetic_answer_only_size=0))
    train, grpo = read_jsonl(tmp_path / "out" / "train.jsonl"), read_jsonl(tmp_path / "out" / "grpo.jsonl")
    assert [(r["id"], r["question"], r["gold"]) for r in grpo] == [(r["id"], r["question"], r["gold"]) for r in train]
    assert {r["solution"] for r in grpo} == {""} and all(r["solution"] for r in train)
    assert stats["grpo"] == {"count": 200, "answer_only": False}


def test_synthetic_answer_only_problems_come_from_a_harder_band_sft_never_sees(tmp_path):
    stats = write_splits(synthetic_cfg(tmp_path, synthetic_answer_only_size=150, synthetic_answer_only_min_steps=3,
                              synthetic_answer_only_max_steps=4, synthetic_test_max_steps=4))
    out = tmp_path / "out"
    train, grpo, test = (read_jsonl(out / f"{s}.jsonl") for s in ("train", "grpo", "test"))
    assert len(train) == 200 and len(grpo) == 150 and stats["grpo"] == {"count": 150, "answer_only": True}
    assert {steps(r) for r in train} == {1, 2} and {steps(r) for r in grpo} == {3, 4}
    assert {steps(r) for r in test} == {1, 2, 3, 4}  # the test split spans both bands
    assert {r["solution"] for r in grpo} == {""}
    questions = [{r["question"] for r in rows} for rows in (train, grpo, test)]
    assert not (questions[0] & questions[1]) and not (questions[1] & questions[2]) and not (questions[0] & questions[2])
    assert len({r["id"] for r in train + grpo}) == 350
    # the demonstrations are exactly what they were without answer-only problems
    assert read_jsonl(out / "train.jsonl") == train
    write_splits(synthetic_cfg(tmp_path, synthetic_test_max_steps=4))
    assert read_jsonl(out / "train.jsonl") == train


def test_answer_only_share_withholds_solutions_of_jsonl_train_rows(tmp_path):
    rows = [{"question": f"Tom has {i} pens and buys 2. How many now?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
            for i in range(40)]
    source = f"jsonl:{write_jsonl(tmp_path / 'many.jsonl', rows)}"
    stats = write_splits(cfg(tmp_path, train_source=source, answer_only_share=0.25, seed=7))
    train, grpo = read_jsonl(tmp_path / "out" / "train.jsonl"), read_jsonl(tmp_path / "out" / "grpo.jsonl")
    assert len(train) == 30 and len(grpo) == 10 and stats["counts"]["train"] == 30
    assert {r["solution"] for r in grpo} == {""} and not ({r["id"] for r in train} & {r["id"] for r in grpo})
    assert sorted(r["id"] for r in train + grpo) == sorted(f"train-{i}" for i in range(1, 41))
    assert [r["id"] for r in grpo] != [f"train-{i}" for i in range(31, 41)]  # drawn, not the tail
    write_splits(cfg(tmp_path, train_source=source, answer_only_share=0.25, seed=7))
    assert read_jsonl(tmp_path / "out" / "grpo.jsonl") == grpo  # same seed, same split


def test_answer_only_settings_fail_early_naming_the_key(tmp_path):
    from components.common.errors import ConfigError

    with pytest.raises(ConfigError, match="synthetic_answer_only_min_steps .* is above"):
        load_params(None, ["data.synthetic_answer_only_min_steps=4", "data.synthetic_answer_only_max_steps=2"])


# GSM8K-format rows of 1, 2, 3 and 4 calculator annotations, one without annotations (3 reasoning
# lines) and one answer-only row (unbanded).
BANDED_ROWS = [
    {"question": f"Q{n}: how many after {n} steps?",
     "answer": "\n".join(f"Step {k}: {k}+1 = <<{k}+1={k + 1}>>{k + 1}" for k in range(n)) + f"\n#### {n}"}
    for n in (1, 2, 3, 4)
] + [
    {"question": "Q5: lines without annotations?", "answer": "First 2.\nThen 3.\nSo 5.\n#### 5"},
    {"question": "Q6: only the final answer?", "answer": "#### 6"},
]


def test_steps_are_counted_from_annotations_lines_or_unbanded(tmp_path):
    stats = write_splits(cfg(tmp_path, train_source=f"jsonl:{write_jsonl(tmp_path / 'banded.jsonl', BANDED_ROWS)}"))
    rows = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert [r["steps"] for r in rows] == [1, 2, 3, 4, 3, None]
    assert stats["steps"]["train"] == {"1": 1, "2": 1, "3": 2, "4": 1, "unbanded": 1}
    assert read_jsonl(tmp_path / "out" / "test.jsonl")[0]["steps"] == 1


def test_step_bands_split_any_source_into_demonstrations_and_answer_only_problems(tmp_path, capsys):
    source = f"jsonl:{write_jsonl(tmp_path / 'banded.jsonl', BANDED_ROWS)}"
    stats = write_splits(cfg(tmp_path, train_source=source, demo_max_steps=2, answer_only_min_steps=4))
    train, grpo = read_jsonl(tmp_path / "out" / "train.jsonl"), read_jsonl(tmp_path / "out" / "grpo.jsonl")
    assert [(r["question"][:2], r["steps"]) for r in train] == [("Q1", 1), ("Q2", 2)]
    # 4 annotations and the answer-only row go to GRPO without their solution; the 3-step rows to neither
    assert [(r["question"][:2], r["steps"], r["solution"]) for r in grpo] == [("Q4", 4, ""), ("Q6", None, "")]
    assert stats["outside_bands"] == 2 and stats["grpo"]["answer_only"] is True
    assert stats["steps"]["grpo"] == {"4": 1, "unbanded": 1}


def test_step_bands_that_overlap_or_leave_no_demonstration_fail_naming_the_keys(tmp_path):
    from components.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.answer_only_min_steps \(2\) must be above data.demo_max_steps \(2\)"):
        load_params(None, ["data.demo_max_steps=2", "data.answer_only_min_steps=2"])
    source = f"jsonl:{write_jsonl(tmp_path / 'banded.jsonl', BANDED_ROWS)}"
    with pytest.raises(DataError, match="no demonstrations left for SFT .*data.answer_only_min_steps=1"):
        write_splits(cfg(tmp_path, train_source=source, answer_only_min_steps=1))
    assert not (tmp_path / "out").exists()  # nothing half-written
