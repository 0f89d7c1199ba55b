"""benchmarks/grpo_gain.py's work folder sees the checkout's vLLM environment as `grpoflow run` does,
so the selection stage samples GRPO's prompts with the same engine; the result names that engine.
(The whole benchmark runs in tests/slow/test_grpo_gain.py.)"""

from __future__ import annotations

import shutil

from benchmarks import grpo_gain


def test_the_work_folder_links_the_checkouts_vllm_and_removing_it_keeps_the_environment(tmp_path):
    repo, work = tmp_path / "checkout", tmp_path / "work"
    (repo / ".venv-vllm" / "bin").mkdir(parents=True)
    (repo / ".venv-vllm" / "bin" / "python").write_text("#!/bin/sh\n")
    work.mkdir()
    assert grpo_gain.link_vllm(work, repo)
    assert (work / ".venv-vllm" / "bin" / "python").read_text() == "#!/bin/sh\n"
    assert grpo_gain.link_vllm(work, repo)  # a second run on a kept folder: already there
    shutil.rmtree(work)  # what the benchmark does with its temporary folder
    assert (repo / ".venv-vllm" / "bin" / "python").exists()


def test_no_vllm_in_the_checkout_links_nothing_and_an_existing_folder_is_left_alone(tmp_path):
    repo, work = tmp_path / "checkout", tmp_path / "work"
    repo.mkdir()
    work.mkdir()
    assert not grpo_gain.link_vllm(work, repo) and not (work / ".venv-vllm").exists()
    (repo / ".venv-vllm").mkdir()
    (work / ".venv-vllm").mkdir()  # the user's own: not replaced by a link
    (work / ".venv-vllm" / "mine").write_text("x")
    assert grpo_gain.link_vllm(work, repo) and not (work / ".venv-vllm").is_symlink()
    assert (work / ".venv-vllm" / "mine").read_text() == "x"


def test_the_selection_engine_is_read_from_the_stages_last_line():
    out = ("backend auto: vllm\nselection: kept 163 of 800 prompts (never solved 613, always solved 24) -> "
           "data/selected/prompts.jsonl (75.9 s, vllm)\n")
    assert grpo_gain.selection_backend(out) == "vllm"
    assert grpo_gain.selection_backend(out.replace("vllm)", "transformers)")) == "transformers"
    assert grpo_gain.selection_backend("the stage printed nothing\n") == "unknown"
