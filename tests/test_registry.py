"""Tests for pipelines/registry/register.py on a real MLflow SQLite registry with a tiny real model:
registration (idempotent on the dvc.lock md5, loads back with the transformers flavour,
explicit pip requirements), the paired promotion gate, forced promotion and rollback.

    pytest -q tests/test_registry.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from components.common.errors import InputError, RegistryError
from components.common.tracking import configure
from components.evaluation.reports import read_items
from pipelines.params.config import load_params
from pipelines.registry.moves import force_promote, rollback
from pipelines.registry.promotion import compare_with_champion, gate
from pipelines.registry.register import CHALLENGER, CHAMPION, DECISION_TAG, PREVIOUS_TAG, register
from tests.toy_repo import make_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


EVALUATED_ON = {"test_sha256": "f" * 64, "protocol": "grpoflow", "max_new_tokens": 256}


def write_eval(root: Path, correct: list[bool], accuracy_key: str = "accuracy_strict") -> None:
    ev = root / "reports" / "eval"
    ev.mkdir(parents=True, exist_ok=True)
    with open(ev / "grpo.items.jsonl", "w") as fh:
        for i, c in enumerate(correct):
            fh.write(json.dumps({"id": f"q{i}", "completion": "x", "extracted": "1", "correct": c}) + "\n")
    acc = sum(correct) / len(correct)
    (ev / "grpo.json").write_text(json.dumps({accuracy_key: acc, "n": len(correct), **EVALUATED_ON}))
    (ev / "sft.json").write_text(json.dumps({accuracy_key: 0.1, "n": len(correct)}))


@pytest.fixture
def repo(tmp_path, tiny_model, monkeypatch):
    import shutil

    shutil.copytree(tiny_model, tmp_path / "models" / "grpo")
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def new_run(params) -> str:
    import mlflow

    exp = configure(params)
    return mlflow.MlflowClient().create_run(exp, run_name="training-pipeline").info.run_id


def lineage(md5: str) -> dict[str, str]:
    return {"lineage.dvc_lock_md5": md5, "lineage.git_commit": "abc123", "lineage.git_dirty": "false"}


def registered(params, repo: Path, right: int, md5: str, gated: bool = False):
    """A new version whose first `right` of 100 items are correct (items written as the evaluate
    stage does, then registered); gated when asked."""
    write_eval(repo, [i < right for i in range(100)])
    reg = register(params, lineage(md5 * 32), new_run(params), repo)
    if gated:
        gate(params, reg, repo)
    return reg


def registry(params):
    """The MLflow client of `params`' store (mlflow's URI is process-global: set before the client)."""
    import mlflow

    configure(params)
    return mlflow.MlflowClient()


def test_register_is_idempotent_loads_back_and_first_version_becomes_champion(repo):
    import mlflow

    params = load_params()
    write_eval(repo, [True] * 30 + [False] * 70)
    run_id = new_run(params)
    reg = register(params, lineage("0" * 32), run_id, repo)
    assert reg.created and reg.version == "1"
    again = register(params, lineage("0" * 32), new_run(params), repo)
    assert not again.created and again.version == "1"

    client = mlflow.MlflowClient()
    mv = client.get_model_version("grpoflow-policy", "1")
    assert mv.tags["lineage.git_commit"] == "abc123" and mv.tags["lineage.dvc_lock_md5"] == "0" * 32
    assert mv.tags["metric.grpo.accuracy_strict"] == "0.3000"
    assert "| grpo | 0.3000 | 100 |" in mv.description
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHALLENGER).version) == "1"

    decision = gate(params, reg, repo)
    assert decision.decision == "promoted" and "no champion yet" in decision.reason
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "1"
    # A second gate on the same version changes nothing and says what is true now, and who decided when.
    again = gate(params, reg, repo)
    assert again.decision == "promoted" and again.reason.startswith(f"v1 is champion, decided by run {run_id} on 20")
    assert "becomes champion" not in again.reason

    uri = "models:/grpoflow-policy@champion"
    reqs = Path(mlflow.artifacts.download_artifacts(f"{uri}/requirements.txt")).read_text()
    assert "transformers==" in reqs and "torchvision" not in reqs
    components = mlflow.transformers.load_model(uri, return_type="components")
    out = components["model"].generate(**components["tokenizer"]("1+1=", return_tensors="pt"), max_new_tokens=3)
    assert out.shape[1] > 4


def test_gate_rejects_no_better_challenger_and_promotes_a_better_one(repo):
    import mlflow

    params = load_params()
    configure(params)  # mlflow's URI is process-global: set it before making a client
    client = mlflow.MlflowClient()
    base = [i < 40 for i in range(200)]
    write_eval(repo, base)
    gate(params, register(params, lineage("1" * 32), new_run(params), repo), repo)

    # Same accuracy on the same items (different items right): no promotion, tags say why.
    write_eval(repo, [40 <= i < 80 for i in range(200)])
    d2 = gate(params, register(params, lineage("2" * 32), new_run(params), repo), repo)
    assert d2.decision == "rejected" and d2.version == "2"
    tags = client.get_model_version("grpoflow-policy", "2").tags
    assert tags[DECISION_TAG] == "rejected"
    assert "not more accurate" in tags["promotion.reason"] and "champion v1 kept" in tags["promotion.reason"]
    assert json.loads(tags["promotion.p_value"]) == 1.0
    assert tags["eval.test_sha256"] == "f" * 64 and tags["eval.protocol"] == "grpoflow"
    assert tags["promotion.champion_reevaluated"] == "false" and tags["promotion.n"] == "200"
    assert tags["promotion.test_sha256"] == tags["eval.test_sha256"]
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "1"
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHALLENGER).version) == "2"

    # Clearly better on the same items: promoted, the previous champion recorded.
    write_eval(repo, [i < 80 for i in range(200)])
    d3 = gate(params, register(params, lineage("3" * 32), new_run(params), repo), repo)
    assert d3.decision == "promoted", d3.reason
    assert d3.numbers["b"] == 40 and d3.numbers["c"] == 0 and d3.numbers["p_value"] < 1e-9
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "3"
    assert client.get_model_version("grpoflow-policy", "3").tags[PREVIOUS_TAG] == "1"

    # Rollback puts v1 back; forcing v2 records the reason.
    assert rollback(params, "grpoflow-policy").version == "1"
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "1"
    with pytest.raises(RegistryError, match="nothing to roll back"):
        rollback(params, "grpoflow-policy")
    forced = force_promote(params, "grpoflow-policy", "2", "hand-checked")
    assert forced.decision == "forced"
    tags = client.get_model_version("grpoflow-policy", "2").tags
    assert tags[DECISION_TAG] == "forced" and "hand-checked" in tags["promotion.reason"]
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "2"
    with pytest.raises(RegistryError, match="does not exist"):
        force_promote(params, "grpoflow-policy", "99", "x")


def test_interrupted_gate_is_completed_by_the_next_run(repo):
    """A crash after the alias moved but before the decision tag: the next gate finishes the job."""
    params = load_params()
    client = registry(params)
    registered(params, repo, 40, "5", gated=True)
    reg = registered(params, repo, 80, "6")
    # What _write_decision leaves behind if the process dies just before its last write:
    client.set_model_version_tag("grpoflow-policy", reg.version, "promotion.reason", "better: promoted")
    client.set_registered_model_alias("grpoflow-policy", CHAMPION, reg.version)
    assert DECISION_TAG not in client.get_model_version("grpoflow-policy", reg.version).tags

    again = register(params, lineage("6" * 32), new_run(params), repo)  # the next run: same dvc.lock
    assert not again.created
    decision = gate(params, again, repo)
    assert decision.decision == "promoted" and decision.reason == "better: promoted"
    assert client.get_model_version("grpoflow-policy", reg.version).tags[DECISION_TAG] == "promoted"


@pytest.mark.parametrize(
    "chal, champ, alpha, min_delta, expected",
    [
        ([True] * 10 + [False] * 90, [False] * 100, 0.05, 0.0, True),  # b=10, c=0: p=0.002
        ([True] * 5 + [False] * 95, [False] * 100, 0.05, 0.0, False),  # b=5: p=0.0625
        ([True] * 10 + [False] * 90, [False] * 100, 0.05, 0.2, False),  # gain 0.1 < min_delta
        ([False] * 100, [True] * 10 + [False] * 90, 0.05, 0.0, False),  # worse, even though p small
    ],
)
def test_gate_promotes_only_a_significant_gain_of_at_least_min_delta(chal, champ, alpha, min_delta, expected):
    ok, numbers = compare_with_champion(
        {str(i): c for i, c in enumerate(chal)}, {str(i): c for i, c in enumerate(champ)}, alpha, min_delta
    )
    assert ok is expected, numbers


def test_gate_pairs_by_item_id_only():
    ok, numbers = compare_with_champion({"a": True, "b": True}, {"c": False}, 0.05, 0.0)
    assert not ok and numbers["n"] == 0


def test_bad_items_file_names_file_and_line(tmp_path):
    p = tmp_path / "grpo.items.jsonl"
    p.write_text('{"id": "1", "correct": true}\n{"id": "2"}\n')
    with pytest.raises(InputError, match=r"grpo.items.jsonl:2: expected"):
        read_items(p)


def test_register_without_model_fails_clearly(repo):
    import shutil

    shutil.rmtree(repo / "models" / "grpo")
    params = load_params()
    write_eval(repo, [True, False])
    with pytest.raises(RegistryError, match="neither config.json nor a LoRA adapter"):
        register(params, lineage("4" * 32), new_run(params), repo)


def test_gate_needs_min_items_shared():
    ok, numbers = compare_with_champion({str(i): i < 60 for i in range(99)}, {str(i): False for i in range(99)},
                                        0.05, 0.0, min_items=100)
    assert not ok and numbers["n"] == 99 and numbers["p_value"] < 1e-10


def test_alias_moves_only_if_the_champion_is_unchanged(repo, monkeypatch):
    """grpoflow's own moves wait for the registry lease; a move by hand (the MLflow UI or API, which
    take no lease) that lands while the gate compares makes the gate stop instead of overwriting it."""
    import mlflow

    from pipelines.registry import promotion

    params = load_params()
    configure(params)
    client = mlflow.MlflowClient()
    write_eval(repo, [i < 40 for i in range(100)])
    gate(params, register(params, lineage("7" * 32), new_run(params), repo), repo)  # v1 champion
    write_eval(repo, [i < 41 for i in range(100)])
    register(params, lineage("8" * 32), new_run(params), repo)  # v2, not gated yet
    write_eval(repo, [i < 90 for i in range(100)])
    v3 = register(params, lineage("9" * 32), new_run(params), repo)
    real_items = promotion.registered_items

    def items_while_someone_moves_the_alias_by_hand(name, version, tags):
        if version == "1":
            client.set_registered_model_alias("grpoflow-policy", CHAMPION, "2")
        return real_items(name, version, tags)

    monkeypatch.setattr(promotion, "registered_items", items_while_someone_moves_the_alias_by_hand)
    with pytest.raises(RegistryError, match=r"champion moved from v1 to v2 outside grpoflow's registry lease"):
        gate(params, v3, repo)
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "2"
    assert DECISION_TAG not in client.get_model_version("grpoflow-policy", "3").tags  # the next run decides


def test_gate_reevaluates_a_champion_evaluated_on_other_items(repo, monkeypatch):
    """After a change of data.seed the champion's items are other questions under the same ids: the
    gate evaluates the champion on the challenger's items before the paired test."""
    import mlflow

    from components import data
    from components.evaluation.reports import write_reports
    from components.evaluation.scoring import data_source, evaluate_model
    from components.models.resolve import resolve_model
    from components.problems.sources import load_problems
    from pipelines.params.config import DataParams

    client = mlflow.MlflowClient()
    small = ["evaluate.backend=transformers", "evaluate.max_new_tokens=8", "register.min_items=5"]

    def evaluate_and_register(seed: int, md5: str):
        data.write_splits(DataParams(synthetic_train_size=20, synthetic_test_size=12, synthetic_test_top_band_size=0,
                                     seed=seed))
        params = load_params(None, [*small, f"data.seed={seed}"])
        problems = load_problems(data_source(params))
        result = evaluate_model(resolve_model("models/grpo"), problems, params, protocol="grpoflow",
                                backend="transformers", data=data_source(params))
        write_reports("reports/eval", {"grpo": result, "sft": result}, None)
        reg = register(params, lineage(md5), new_run(params), repo)
        return params, reg

    params, v1 = evaluate_and_register(1, "a" * 32)
    assert gate(params, v1, repo).decision == "promoted"
    params, v2 = evaluate_and_register(2, "b" * 32)
    tags1 = client.get_model_version("grpoflow-policy", "1").tags
    tags2 = client.get_model_version("grpoflow-policy", "2").tags
    assert tags1["eval.test_sha256"] != tags2["eval.test_sha256"]
    decision = gate(params, v2, repo)
    tags2 = client.get_model_version("grpoflow-policy", "2").tags
    assert tags2["promotion.champion_reevaluated"] == "true"
    assert tags2["promotion.test_sha256"] == tags2["eval.test_sha256"]
    in_band = [p for p in load_problems(data_source(params)) if p["steps"] == 3]  # evaluate.target_band: 3
    assert tags2["promotion.target_band"] == "3" and tags2["promotion.n"] == str(len(in_band)) and 0 < len(in_band) < 12
    # The same weights on the same items: every pair agrees, nothing to promote.
    assert decision.decision == "rejected" and decision.numbers["b"] == decision.numbers["c"] == 0
    artifacts = [a.path for a in client.list_artifacts(v2.run_id, "promotion")]
    assert artifacts == ["promotion/champion_v1_items.json"]


def write_items(root: Path, strict: list[bool], flexible: list[bool], tagged: list[bool]) -> None:
    """grpo.items.jsonl with the three judgements the evaluate stage writes per item."""
    ev = root / "reports" / "eval"
    ev.mkdir(parents=True, exist_ok=True)
    with open(ev / "grpo.items.jsonl", "w") as fh:
        for i, (c, f, t) in enumerate(zip(strict, flexible, tagged, strict=True)):
            fh.write(json.dumps({"id": f"q{i}", "completion": "x", "extracted": "1", "correct": c,
                                 "correct_flexible": f, "format_ok": t}) + "\n")
    (ev / "grpo.json").write_text(json.dumps({"accuracy_strict": sum(strict) / len(strict), "n": len(strict),
                                              **EVALUATED_ON}))
    (ev / "sft.json").write_text(json.dumps({"accuracy_strict": 0.1, "n": len(strict)}))


def test_gate_says_when_the_gain_is_format_and_uses_the_metric_param(repo):
    """A challenger that only learned to tag its answers: strict accuracy +20 points, correctness
    unchanged. The default gate (strict) promotes it and says the gain is format, not correctness;
    with evaluate.primary_metric=accuracy_flexible the gate pairs correctness and keeps the champion."""
    import mlflow

    params = load_params()
    configure(params)
    client = mlflow.MlflowClient()
    n = 200
    right = [i < 60 for i in range(n)]  # 30% correct, for both versions
    write_items(repo, [i < 20 for i in range(n)], right, [i < 20 or i >= 60 for i in range(n)])  # champion: few tagged
    gate(params, register(params, lineage("7" * 32), new_run(params), repo), repo)
    write_items(repo, right, right, [True] * n)  # challenger: the same answers, all tagged

    flexible = load_params(overrides=["evaluate.primary_metric=accuracy_flexible"])
    kept = gate(flexible, register(flexible, lineage("8" * 32), new_run(flexible), repo), repo)
    assert kept.decision == "rejected" and kept.numbers["metric"] == "accuracy_flexible"
    assert kept.numbers["delta"] == 0.0 and "v2 accuracy_flexible 0.3000 vs champion v1 0.3000" in kept.reason

    promoted = gate(params, register(params, lineage("9" * 32), new_run(params), repo), repo)
    assert promoted.decision == "promoted" and promoted.numbers["metric"] == "accuracy_strict"
    reason = client.get_model_version("grpoflow-policy", promoted.version).tags["promotion.reason"]
    assert "correctness (accuracy_flexible, the answer is right) champion v1 30.0% -> v3 30.0%, +0.0 points" in reason
    assert "format (the answer is tagged) 80.0% -> 100.0%" in reason
    assert reason.endswith("the gain is format, not correctness")


def test_gate_states_the_target_bands_checked_accuracy_first_then_correctness_then_the_other_bands(repo):
    """With evaluate.target_band the gate decides on strict accuracy on the band as before, and its reason
    restates the change as the run summary does: on the band, checked accuracy first, then correctness,
    each with its 95% interval and exact McNemar p, the format apart; then the other bands' change."""
    params = load_params()  # evaluate.target_band: 3
    configure(params)

    def write(right: int, checked: int, right_other: int) -> None:
        """100 items of 3 steps (the band), then 200 of 1 or 2 steps, every answer tagged."""
        ev = repo / "reports" / "eval"
        ev.mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(300):
            band = i < 100
            ok = i < right if band else i - 100 < right_other
            rows.append({"id": f"q{i}", "completion": "x", "extracted": "1", "steps": 3 if band else 1 + i % 2,
                         "correct": ok, "correct_flexible": ok, "correct_checked": ok and (i < checked or not band),
                         "format_ok": True})
        (ev / "grpo.items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (ev / "grpo.json").write_text(json.dumps({"accuracy_strict": sum(r["correct"] for r in rows) / 300, "n": 300,
                                                  **EVALUATED_ON}))
        (ev / "sft.json").write_text(json.dumps({"accuracy_strict": 0.1, "n": 300}))

    write(right=15, checked=12, right_other=180)
    gate(params, register(params, lineage("c" * 32), new_run(params), repo), repo)
    write(right=31, checked=27, right_other=181)
    decision = gate(params, register(params, lineage("d" * 32), new_run(params), repo), repo)
    assert decision.decision == "promoted" and decision.numbers["metric"] == "accuracy_strict"
    assert decision.numbers["n"] == 100 and decision.numbers["delta"] == 0.16
    reason = registry(params).get_model_version("grpoflow-policy", "2").tags["promotion.reason"]
    assert reason.startswith("v2 accuracy_strict on 3 steps 0.3100 vs champion v1 0.1500 on 100 shared items")
    change = r"\+[\d.]+ points \(95% CI \+[\d.]+ to \+[\d.]+\), exact McNemar p = [\d.e-]+"
    assert re.search(r"promoted\. Target band \(3 steps\), n = 100: "
                     r"accuracy_checked \(right, no equation shown wrong\) "
                     rf"champion v1 12\.0% -> v2 27\.0%, {change}; correctness \(accuracy_flexible, the answer is "
                     rf"right\) 15\.0% -> 31\.0%, {change}; format \(the answer is tagged\) 100\.0% -> 100\.0%; "
                     r"accuracy_strict \(right and tagged\) 15\.0% -> 31\.0%, \+16\.0 points, p = [\d.e-]+: "
                     r"correctness rose\. Other bands, n = 200: "
                     r"accuracy_checked \(right, no equation shown wrong\) champion v1 90\.0% -> v2 90\.5%, "
                     r"\+0\.5 points \(95% CI ", reason), reason


def test_gate_on_flexible_names_items_without_the_column(repo):
    params = load_params(overrides=["evaluate.primary_metric=accuracy_flexible"])
    write_eval(repo, [i < 40 for i in range(100)])  # items without correct_flexible
    gate(params, register(params, lineage("a" * 32), new_run(params), repo), repo)
    write_eval(repo, [i < 80 for i in range(100)])
    with pytest.raises(InputError, match=r"grpoflow-policy v2 items \S+/grpo.items.jsonl: "
                                         r"item q0 has no boolean 'correct_flexible'"):
        gate(params, register(params, lineage("b" * 32), new_run(params), repo), repo)


def test_the_decision_kinds_are_the_ones_produced():
    """Decision.decision's type lists what the code produces, no more, no less (it once listed an
    "unchanged" never produced and left out "rollback")."""
    import ast
    import typing

    from pipelines.handoff import DecisionKind
    from pipelines.registry import moves, promotion

    produced = set()
    for node in (n for m in (promotion, moves) for n in ast.walk(ast.parse(Path(m.__file__).read_text()))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Decision" and len(node.args) >= 3:
            produced |= {n.value for n in ast.walk(node.args[2])
                         if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert produced == set(typing.get_args(DecisionKind))


def make_adapter(root: Path, seed: int = 1) -> Path:
    """models/base (the tiny model) and models/grpo: a LoRA adapter over it with non-zero weights."""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.models import adapters

    base = root / "models" / "base"
    if not base.exists():
        shutil.copytree(root / "models" / "grpo", base)
        shutil.rmtree(root / "models" / "grpo")
    torch.manual_seed(seed)
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(base), cfg)
    adapters.save_adapter(peft, AutoTokenizer.from_pretrained(base), root / "models" / "grpo",
                          adapters.base_ref_for("models/base", "tiny"))
    return root / "models" / "grpo"


def test_an_adapter_version_stores_the_adapter_and_loads_where_no_base_is(repo, tmp_path, monkeypatch):
    import shutil

    import mlflow

    from components.models import adapters
    from components.models.modelio import load_model, load_tokenizer
    from components.models.resolve import resolve_model
    from components.training.train_samples import greedy

    params = load_params()
    adapter = make_adapter(repo)
    write_eval(repo, [True] * 30 + [False] * 70)
    reg = register(params, lineage("1" * 32), new_run(params), repo)
    make_adapter(repo, seed=2)  # a second run over the same base: the base is not registered again
    reg2 = register(params, lineage("2" * 32), new_run(params), repo)
    client = mlflow.MlflowClient()
    mv = client.get_model_version("grpoflow-policy", reg.version)
    sha = adapters.weights_sha256(repo / "models/base")
    assert mv.tags["grpoflow.kind"] == "adapter" and mv.tags["lineage.base_weights_sha256"] == sha
    assert mv.tags["lineage.base_model"] == "models:/grpoflow-policy-base/1"
    assert (client.get_model_version("grpoflow-policy", reg2.version).tags["lineage.base_model"]
            == mv.tags["lineage.base_model"])
    assert len(client.search_model_versions("name = 'grpoflow-policy-base'")) == 1
    files = Path(mlflow.artifacts.download_artifacts(f"models:/grpoflow-policy/{reg.version}",
                                                     dst_path=str(tmp_path / "dl")))
    assert not list(files.rglob("model.safetensors")) and list(files.rglob("adapter_model.safetensors"))

    # Elsewhere: no models/base, an empty cache of bases; the registry alone.
    expected = adapters.merge(adapter, repo / "models/base", tmp_path / "merged-here")  # the second adapter
    shutil.rmtree(repo / "models")
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPOFLOW_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model(f"models:/grpoflow-policy/{reg2.version}", download_dir=tmp_path / "v2", params=params)
    assert resolved.adapter_dir and (cache / "bases" / sha / "config.json").is_file()
    tok = load_tokenizer(resolved.tokenizer_dir)
    prompts = ["1+1=", "2+3=", "9+9="]
    assert greedy(load_model(resolved.model_dir), tok, prompts, 5) == greedy(load_model(expected), tok, prompts, 5)
    components = mlflow.transformers.load_model(
        f"models:/grpoflow-policy/{reg.version}", return_type="components", base_model_path=str(cache / "bases" / sha)
    )
    assert type(components["model"]).__name__ == "PeftModelForCausalLM"


# --------------------------------------------------------------------------- bad registry input


def gate_exit(params, reg, root, capsys) -> tuple[int, list[str]]:
    """The gate as a command runs it (one_line_errors): its exit code and its `error:` lines."""
    from components.common.entry import one_line_errors

    code = one_line_errors(lambda: gate(params, reg, root) and 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.startswith("error: ")]


def artifact_file(uri: str) -> Path:
    from urllib.parse import urlparse

    return Path(urlparse(uri).path)


def promotion_tags(client, version: str) -> list[str]:
    return [k for k in client.get_model_version("grpoflow-policy", version).tags if k.startswith("promotion.")]


def test_the_gate_decides_on_the_registered_items_not_the_checkouts_copy(repo):
    """A stale or edited local items file, or none at all, changes nothing: the gate reads the items
    registered with each version, checked against the hash recorded at registration."""
    params = load_params()
    client = registry(params)
    registered(params, repo, 40, "c", gated=True)
    v2 = registered(params, repo, 80, "d")
    write_eval(repo, [False] * 100)  # the checkout's copy edited after registration
    assert gate(params, v2, repo).decision == "promoted"
    v3 = registered(params, repo, 95, "e")
    (repo / "reports" / "eval" / "grpo.items.jsonl").unlink()  # and gone
    decided = gate(params, v3, repo)
    assert decided.decision == "promoted" and decided.numbers["items_checked"] is True
    tags = client.get_model_version("grpoflow-policy", "3").tags
    assert len(tags["eval.items_sha256"]) == 64 and tags["promotion.items_checked"] == "true"


def test_registered_items_changed_or_gone_stop_the_gate_in_one_line_writing_nothing(repo, capsys):
    params = load_params()
    client = registry(params)
    registered(params, repo, 40, "c", gated=True)  # v1 champion
    v2 = registered(params, repo, 80, "d")
    ours = artifact_file(client.get_model_version("grpoflow-policy", "2").tags["eval.items_uri"])
    theirs = artifact_file(client.get_model_version("grpoflow-policy", "1").tags["eval.items_uri"])
    kept = ours.read_text()

    ours.write_text(kept.replace('"correct": false', '"correct": true'))  # changed after registration
    code, lines = gate_exit(params, v2, repo, capsys)
    assert code == 2 and len(lines) == 1 and "grpoflow-policy v2: its evaluation items" in lines[0]
    assert "recorded at registration (eval.items_sha256): they changed since" in lines[0]
    ours.unlink()  # gone
    code, lines = gate_exit(params, v2, repo, capsys)
    assert code == 2 and len(lines) == 1 and re.search(r"v2: its evaluation items \S+ \(eval.items_uri\) cannot be "
                                                       r"read .*; restore that artifact", lines[0]), lines
    ours.write_text(kept)
    uri = client.get_model_version("grpoflow-policy", "2").tags["eval.items_uri"]
    client.delete_model_version_tag("grpoflow-policy", "2", "eval.items_uri")  # not registered by grpoflow run
    code, lines = gate_exit(params, v2, repo, capsys)
    assert code == 2 and len(lines) == 1 and "grpoflow-policy v2 has no eval.items_uri tag" in lines[0]
    client.set_model_version_tag("grpoflow-policy", "2", "eval.items_uri", uri)
    theirs.write_text(theirs.read_text() + "\n")  # the champion's changed
    code, lines = gate_exit(params, v2, repo, capsys)
    assert code == 2 and len(lines) == 1 and "grpoflow-policy v1: its evaluation items" in lines[0]
    assert promotion_tags(client, "2") == []  # nothing written
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "1"

    # A champion registered before the hash was recorded: compared unchecked, and the gate says so.
    theirs.write_text(theirs.read_text()[:-1])
    client.delete_model_version_tag("grpoflow-policy", "1", "eval.items_sha256")
    decided = gate(params, v2, repo)
    assert decided.decision == "promoted" and decided.numbers["items_checked"] is False
    assert ("promotion: grpoflow-policy v1 was registered before grpoflow recorded its items' hash "
            "(eval.items_sha256); its items") in capsys.readouterr().out


def test_gating_a_version_not_in_the_registry_is_one_line_exit_2(repo, capsys):
    from pipelines.handoff import Registration

    params = load_params()
    code, lines = gate_exit(params, Registration("grpoflow-policy", "99", created=False), repo, capsys)
    assert code == 2 and len(lines) == 1 and "grpoflow-policy version 99 does not exist in sqlite:" in lines[0]


def test_rollback_to_a_deleted_version_moves_nothing_and_writes_nothing(repo):
    import subprocess
    import sys

    params = load_params()
    client = registry(params)
    registered(params, repo, 40, "c", gated=True)
    registered(params, repo, 80, "d", gated=True)  # v2 replaced v1
    client.delete_model_version("grpoflow-policy", "1")
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "rollback", "grpoflow-policy"], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: grpoflow-policy v2 replaced v1, which is no longer in the registry (deleted); nothing moved. "
        "Put champion on a version by hand: grpoflow promote grpoflow-policy VERSION --reason TEXT"]
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "2"
    assert not [k for k in client.get_model_version("grpoflow-policy", "2").tags if k.startswith("rollback.")]


def test_the_next_gate_repairs_the_tags_an_older_race_left(repo):
    """Before the registry lease, two gates could both tag their versions promoted over one champion
    while the alias ended on one of them. The next gate, of a decided version or of a new one, gives
    the other its decision: superseded, naming the winner and its run."""
    params = load_params()
    client = registry(params)
    regs = [registered(params, repo, right, md5)
            for right, md5 in ((40, "1"), (50, "2"), (60, "3"), (70, "4"), (90, "5"))]

    def left_by_a_race(version: str, previous: str | None, run: str) -> None:
        for key, value in {"promotion.decision": "promoted", "promotion.reason": f"gate of v{version}",
                           "promotion.decided_by_run": run, "promotion.decided_at": "2026-11-30 10:00 UTC",
                           **({"promotion.previous_champion": previous} if previous else {})}.items():
            client.set_model_version_tag("grpoflow-policy", version, key, value)
        client.set_registered_model_alias("grpoflow-policy", CHAMPION, version)

    left_by_a_race("1", None, "run-a")
    left_by_a_race("2", None, "run-b")  # both over no champion; the alias ended on v2
    decided = gate(params, regs[1], repo)  # the next run of v2's checkout: nothing new to decide
    assert decided.decision == "promoted"
    tags = client.get_model_version("grpoflow-policy", "1").tags
    assert tags[DECISION_TAG] == "superseded" and tags["promotion.gate_reason"] == "gate of v1"
    assert tags["promotion.reason"] == ("superseded: v2 was promoted first, by run run-b; an older race left v1 tagged "
                                        "promoted over no champion as well (repaired by the gate of v2)")

    left_by_a_race("3", "2", "run-c")
    left_by_a_race("4", "2", "run-d")  # both over v2; the alias ended on v4
    decision = gate(params, regs[4], repo)  # a new version's gate
    assert decision.decision == "promoted" and decision.champion_before == "4"
    assert client.get_model_version("grpoflow-policy", "3").tags["promotion.reason"].startswith(
        "superseded: v4 was promoted first, by run run-d; an older race left v3 tagged promoted over v2 as well")
    assert client.get_model_version("grpoflow-policy", "2").tags[DECISION_TAG] == "promoted"  # replaced, not a stray


def test_a_champion_that_moves_during_a_re_evaluation_is_re_evaluated_in_its_turn(repo, monkeypatch):
    """A re-evaluation runs outside the registry lease. When another process moves the champion
    meanwhile (here `grpoflow promote`, from inside the stand-in for the evaluation, which the
    re-evaluation test above runs for real), the gate re-evaluates the new champion and decides
    against it; after three such moves it records superseded, naming the winner."""
    from pipelines.registry import promotion

    params = load_params()
    client = registry(params)
    for right, md5 in ((40, "1"), (45, "2"), (50, "3"), (55, "4")):
        registered(params, repo, right, md5)
    gate(params, promotion.Registration("grpoflow-policy", "1", created=False), repo)  # v1 champion

    def challenger(md5: str):  # evaluated on other items: every champion is re-evaluated on its items
        reg = registered(params, repo, 90, md5)
        client.set_model_version_tag("grpoflow-policy", reg.version, "eval.test_sha256", md5 * 64)
        return reg

    evaluated, moves = [], []

    def evaluate_while_the_champion_moves(params, name, version, root, test_sha256):
        evaluated.append(version)
        if moves:
            force_promote(params, name, moves.pop(0), "meanwhile, from another checkout")
        return {f"q{i}": {"id": f"q{i}", "correct": i < 40} for i in range(100)}

    monkeypatch.setattr(promotion, "reevaluate", evaluate_while_the_champion_moves)
    moves[:] = ["2"]
    decision = gate(params, challenger("a"), repo)
    assert evaluated == ["1", "2"] and decision.champion_before == "2" and decision.decision == "promoted"

    evaluated.clear()
    moves[:] = ["3", "4", "2"]
    decision = gate(params, challenger("b"), repo)
    assert evaluated == ["5", "3", "4"] and decision.decision == "superseded"
    assert decision.reason.startswith("superseded: v2 was promoted first, by hand, while this gate re-evaluated "
                                      "v5, v3, v4; v6 was not compared with it")
    assert client.get_model_version("grpoflow-policy", "6").tags[DECISION_TAG] == "superseded"
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "2"


@pytest.mark.parametrize("command", ["rollback", "promote"])
def test_a_champion_moved_before_the_lease_stops_a_rollback_and_a_forced_promotion_records_the_new_one(
        repo, monkeypatch, command):
    """The user read v2 as champion and asked to roll it back (or to force v1); another process
    promoted v3 before this one took the registry lease. The rollback moves nothing, writes nothing,
    and its one line names both versions. The forced promotion, which names its version rather than
    the champion it undoes, goes ahead and records v3, the champion of its turn, as the one replaced."""
    from pipelines.registry import moves

    params = load_params()
    client = registry(params)
    for right, md5 in ((40, "1"), (60, "2")):
        registered(params, repo, right, md5, gated=True)  # v2 replaced v1
    registered(params, repo, 10, "3")
    real, moved = moves.registry_lease, []

    def tags():
        return {v: client.get_model_version("grpoflow-policy", v).tags for v in "123"}

    def lease_after_another_promotion(client, name, purpose, **kw):
        if not moved and purpose in ("grpoflow rollback", "grpoflow promote v1"):
            force_promote(params, name, "3", "from another checkout")
            moved.append(tags())
        return real(client, name, purpose, **kw)

    monkeypatch.setattr(moves, "registry_lease", lease_after_another_promotion)
    if command == "promote":
        decision = force_promote(params, "grpoflow-policy", "1", "hand-checked")
        assert moved and (decision.decision, decision.champion_before) == ("forced", "3")
        assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "1"
        assert client.get_model_version("grpoflow-policy", "1").tags["promotion.previous_champion"] == "3"
        return
    with pytest.raises(RegistryError) as err:
        rollback(params, "grpoflow-policy")
    assert moved and str(err.value).startswith("grpoflow-policy: the champion moved from v2 to v3 while `grpoflow ")
    assert "nothing moved" in str(err.value) and "\n" not in str(err.value)
    assert str(client.get_model_version_by_alias("grpoflow-policy", CHAMPION).version) == "3"
    assert tags() == moved[0]


def test_only_a_missing_model_or_alias_reads_as_no_champion_other_registry_errors_propagate(repo):
    """A store that fails (here its aliases table is gone: MLflow answers TEMPORARILY_UNAVAILABLE,
    as for a server error) must not read as "no champion yet", or a gate would set the alias over
    the real champion."""
    import sqlite3

    import mlflow
    from mlflow.exceptions import MlflowException

    from pipelines.registry.register import alias_version

    params = load_params()
    client = registry(params)
    assert alias_version(client, "grpoflow-policy", CHAMPION) is None  # no model yet
    registered(params, repo, 40, "1")
    assert alias_version(client, "grpoflow-policy", CHAMPION) is None  # a model, no champion
    assert alias_version(client, "grpoflow-policy", CHALLENGER).version == "1"
    db = mlflow.get_tracking_uri().removeprefix("sqlite:///")
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE registered_model_aliases")
    with pytest.raises(MlflowException, match="registered_model_aliases"):
        alias_version(client, "grpoflow-policy", CHAMPION)
