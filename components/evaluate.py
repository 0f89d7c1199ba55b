"""Stage `evaluate`: GSM8K accuracy of the SFT and GRPO models (and the base model by a flag).

Reads the problems (default: the prepared test split), generates greedy completions on
vLLM or transformers (components/generation.py, `evaluate.backend`), scores them with the
project's one scorer (components/gsm8k.py) and writes into `evaluate.output_dir`:

- `<model>.json`: `accuracy_strict` (the `<answer>` tag of a well-formed completion),
  `accuracy_flexible` (the last number, lm-evaluation-harness's flexible-extract idea),
  `format_rate`, `mean_completion_tokens`, `n`, Wilson 95% intervals, completions per
  second and the backend (DVC metrics);
- `<model>.items.jsonl`: per problem `id`, `gold`, `completion`, `extracted`, `correct`
  (+ the flexible and format columns); the promotion gate pairs models by `id`;
- `comparison.json`: GRPO against SFT (and against base), on the same items:
  `delta`, `ci95` (Newcombe's paired interval), `p_value` (exact McNemar), for
  `evaluate.primary_metric`, plus both metrics in `by_metric`.

All of it is logged to MLflow in a run named `evaluate` (metrics `<model>/<metric>`, the
reports as artifacts, the items as a table the UI can browse). Files appear atomically:
a failed run leaves the previous reports in place.

The protocol `lm-eval-gsm8k` (components/lm_eval_gsm8k.py) swaps in lm-evaluation-harness's
5-shot gsm8k prompts and scoring, for numbers comparable with published ones.

    python -m components.evaluate                                   # the DVC stage
    python -m components.evaluate -S evaluate.backend=transformers -S evaluate.limit=50
    grpoflow evaluate --model models/grpo                           # any folder or models:/NAME@ALIAS
    grpoflow evaluate --model models:/grpoflow-policy@champion --data hf:openai/gsm8k:main --protocol lm-eval-gsm8k
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import gsm8k, lm_eval_gsm8k
from components.config import ConfigError, add_params_args, load_params
from components.data import DataError, convert_row, iter_hf, iter_jsonl
from components.generation import BackendError, Generation, GenerationSettings, generate
from components.stats import compare_paired, wilson_interval

log = logging.getLogger("grpoflow.evaluate")

STAGE = "evaluate"
METRICS = ("accuracy_strict", "accuracy_flexible")
MODEL_URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


class EvaluationError(RuntimeError):
    """Bad input to an evaluation (data, model, settings); the message says what to fix."""


# --------------------------------------------------------------------------- problems


def _as_gsm8k_record(obj: Any) -> Any:
    """A prepared row ({id, question, solution, gold}) as a GSM8K-native one for data.convert_row."""
    if isinstance(obj, dict) and "answer" not in obj and "gold" in obj:
        gold = obj.get("gold")
        if not isinstance(gold, str) or not gold.strip():
            raise DataError("field 'gold' must be a non-empty string")
        solution = obj.get("solution") or ""
        if not isinstance(solution, str):
            raise DataError(f"field 'solution' must be a string, got {type(solution).__name__}")
        return {**obj, "answer": f"{solution}\n#### {gold}"}
    return obj


def _records(source: str, split: str):
    if source.startswith("jsonl:"):
        path = Path(source[len("jsonl:") :])
        if not path.is_file():
            raise EvaluationError(f"{path}: data file not found (from {source})")
        return iter_jsonl(path, split)
    if source.startswith("hf:"):
        return iter_hf(source[len("hf:") :], split)
    raise EvaluationError(f"data source {source!r}: expected jsonl:PATH or hf:NAME[:CONFIG]")


def load_problems(source: str, limit: int = 0, split: str = "test") -> list[dict[str, str]]:
    """Validated {id, question, solution, gold, answer} rows; any bad row fails naming file, line and field."""
    rows, bad = [], []
    for where, default_id, obj in _records(source, split):
        if limit and len(rows) >= limit:
            break
        if isinstance(obj, DataError):
            bad.append(f"{where}: {obj}")
            continue
        try:
            record = _as_gsm8k_record(obj)
            row = convert_row(record, default_id)
        except DataError as exc:
            bad.append(f"{where}: {exc}")
            continue
        row["answer"] = record["answer"]  # GSM8K's full answer text, the lm-eval few-shot target
        rows.append(row)
    if bad:
        shown = "\n  ".join(bad[:10])
        more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise EvaluationError(f"{len(bad)} bad row(s) in {source}:\n  {shown}{more}")
    if not rows:
        raise EvaluationError(f"{source}: no problems to evaluate")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EvaluationError(f"{source}: id {dup!r} appears more than once; items are paired by id")
    return rows


def data_source(params: Any, override: str | None = None) -> str:
    src = override or params.evaluate.data
    return src or f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"


def fewshot_source(params: Any, data: str) -> tuple[str, str]:
    """(source, split) of the lm-eval few-shot examples."""
    if params.evaluate.fewshot_source:
        src = params.evaluate.fewshot_source
    elif data.startswith("hf:"):
        src = data
    else:
        src = f"jsonl:{Path(params.data.output_dir) / 'train.jsonl'}"
    return src, "train"


# --------------------------------------------------------------------------- models


@dataclass
class ResolvedModel:
    spec: str  # what the user gave: a folder, a hub id or an MLflow URI
    model_dir: str
    tokenizer_dir: str


def _find_dir(root: Path, test) -> Path | None:
    for folder in sorted([root, *[p for p in root.rglob("*") if p.is_dir()]], key=lambda p: len(p.parts)):
        if test(folder):
            return folder
    return None


def _is_hf_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and (any(p.glob("*.safetensors")) or any(p.glob("*.bin")))


def resolve_model(
    spec: str, download_dir: str | os.PathLike | None = None, params: Any = None
) -> ResolvedModel:
    """A model folder for `spec`: a local folder, an MLflow URI (models:/NAME@ALIAS, runs:/...) or a hub id."""
    if spec.startswith(MODEL_URI_SCHEMES):
        import mlflow

        from components.tracking import configure

        configure(params)  # MLFLOW_TRACKING_URI, else tracking.uri
        dst = Path(download_dir or tempfile.mkdtemp(prefix="grpoflow-model-"))
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=str(dst)))
        except Exception as exc:  # unknown name/alias/version, unreachable server
            raise EvaluationError(
                f"model {spec}: could not download it from MLflow at {mlflow.get_tracking_uri()} "
                f"({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        model_dir = _find_dir(local, _is_hf_model_dir)
        if model_dir is None:
            raise EvaluationError(
                f"model {spec}: no Hugging Face model folder (config.json + *.safetensors) in its artifacts at {local}; "
                "register models with the transformers flavour (components/registry.py does)"
            )
        tok_dir = (
            model_dir
            if (model_dir / "tokenizer_config.json").is_file()
            else _find_dir(local, lambda p: (p / "tokenizer_config.json").is_file())
        )
        if tok_dir is None:
            raise EvaluationError(
                f"model {spec}: no tokenizer (tokenizer_config.json) in its artifacts at {local}"
            )
        return ResolvedModel(spec, str(model_dir), str(tok_dir))
    path = Path(spec)
    if path.exists():
        if not _is_hf_model_dir(path):
            raise EvaluationError(
                f"model folder {path} has no config.json with *.safetensors weights; give a model folder "
                "written by a stage (models/sft, models/grpo) or models:/NAME@ALIAS"
            )
        return ResolvedModel(spec, str(path), str(path))
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec) and not spec.startswith(("models/", "./", "../")):
        return ResolvedModel(spec, spec, spec)  # a hub id; transformers/vLLM fetch it (needs hub access)
    raise EvaluationError(
        f"model {spec}: no such folder; give a model folder (e.g. models/grpo after `dvc repro grpo`), "
        "models:/NAME@ALIAS, or a Hugging Face id"
    )


# --------------------------------------------------------------------------- prompts and scores


def build_prompts(
    problems: list[dict[str, str]], protocol: str, tokenizer, params: Any, data: str
) -> tuple[list[str], list[str]]:
    """(prompts, stop strings) for the protocol."""
    if protocol == "grpoflow":
        return [gsm8k.render_prompt(p["question"], tokenizer) for p in problems], []
    if protocol == "lm-eval-gsm8k":
        cfg = params.evaluate
        shots: list[dict[str, str]] = []
        if cfg.num_fewshot:
            src, split = fewshot_source(params, data)
            shots = [
                {"question": r["question"], "answer": r["answer"]} for r in load_problems(src, split=split)
            ]
        try:
            prompts = lm_eval_gsm8k.build_prompts(
                [p["question"] for p in problems], shots, cfg.num_fewshot, cfg.fewshot_seed
            )
        except ValueError as exc:
            raise EvaluationError(f"lm-eval-gsm8k few-shot examples: {exc}") from None
        return prompts, list(lm_eval_gsm8k.STOP_SEQUENCES)
    raise EvaluationError(f"unknown protocol {protocol!r}; expected grpoflow or lm-eval-gsm8k")


def score_item(problem: dict[str, str], completion: str, num_tokens: int, protocol: str) -> dict[str, Any]:
    """One items.jsonl row. `correct` is the strict judgement (what the promotion gate pairs).

    >>> row = score_item({"id": "t-1", "gold": "7"}, "<reasoning>3 + 4 = 7</reasoning>\\n<answer>7</answer>", 12, "grpoflow")
    >>> row["extracted"], row["correct"], row["correct_flexible"], row["format_ok"]
    ('7', True, True, True)
    >>> row = score_item({"id": "t-2", "gold": "7"}, " 3 + 4 = 7\\n#### 7", 9, "lm-eval-gsm8k")
    >>> row["extracted"], row["correct"], row["extracted_flexible"], row["format_ok"]
    ('7', True, '7', True)
    """
    gold = problem["gold"]
    if protocol == "lm-eval-gsm8k":
        strict = lm_eval_gsm8k.extract(completion, "strict")
        flexible = lm_eval_gsm8k.extract(completion, "flexible")
        correct = lm_eval_gsm8k.exact_match(strict, gold)
        correct_flexible = lm_eval_gsm8k.exact_match(flexible, gold)
        format_ok = strict != lm_eval_gsm8k.INVALID
    else:
        strict = gsm8k.extract_answer(completion, "strict")
        flexible = gsm8k.extract_answer(completion, "flexible")
        correct = gsm8k.answers_match(strict, gold)
        correct_flexible = gsm8k.answers_match(flexible, gold)
        format_ok = gsm8k.has_strict_format(completion)
    return {
        "id": problem["id"],
        "gold": gold,
        "completion": completion,
        "extracted": strict,
        "correct": bool(correct),
        "extracted_flexible": flexible,
        "correct_flexible": bool(correct_flexible),
        "format_ok": bool(format_ok),
        "completion_tokens": int(num_tokens),
    }


def summarize(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy metrics with Wilson 95% intervals from scored items.

    >>> m = summarize([{"correct": True, "correct_flexible": True, "format_ok": True, "completion_tokens": 10},
    ...                {"correct": False, "correct_flexible": True, "format_ok": False, "completion_tokens": 30}])
    >>> m["n"], m["accuracy_strict"], m["accuracy_flexible"], m["format_rate"], m["mean_completion_tokens"]
    (2, 0.5, 1.0, 0.5, 20.0)
    """
    n = len(items)
    k_strict = sum(i["correct"] for i in items)
    k_flex = sum(i["correct_flexible"] for i in items)
    return {
        "n": n,
        "accuracy_strict": k_strict / n if n else 0.0,
        "accuracy_strict_ci95": list(wilson_interval(k_strict, n)),
        "accuracy_flexible": k_flex / n if n else 0.0,
        "accuracy_flexible_ci95": list(wilson_interval(k_flex, n)),
        "format_rate": sum(i["format_ok"] for i in items) / n if n else 0.0,
        "mean_completion_tokens": sum(i["completion_tokens"] for i in items) / n if n else 0.0,
    }


def compare(items_a: list[dict[str, Any]], items_b: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    """Paired comparison A - B on the items both have (matched by id)."""
    b_by_id = {i["id"]: i for i in items_b}
    shared = [i for i in items_a if i["id"] in b_by_id]
    if len(shared) != len(items_a) or len(shared) != len(items_b):
        log.warning("comparing on %d shared items (%d vs %d)", len(shared), len(items_a), len(items_b))
    column = {"accuracy_strict": "correct", "accuracy_flexible": "correct_flexible"}
    by_metric = {
        m: compare_paired([i[column[m]] for i in shared], [b_by_id[i["id"]][column[m]] for i in shared])
        for m in METRICS
    }
    return {"metric": primary, **by_metric[primary], "by_metric": by_metric}


# --------------------------------------------------------------------------- one model


def settings_from(params: Any) -> GenerationSettings:
    cfg = params.evaluate
    return GenerationSettings(
        max_new_tokens=cfg.max_new_tokens,
        dtype=cfg.dtype,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        vllm_python=cfg.vllm_python,
        vllm_args=dict(cfg.vllm_args),
    )


def evaluate_model(
    model: ResolvedModel,
    problems: list[dict[str, str]],
    params: Any,
    *,
    protocol: str,
    backend: str,
    data: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metrics, items) of one model on `problems`."""
    from components.generation import load_tokenizer

    try:
        tokenizer = load_tokenizer(model.tokenizer_dir)
    except (OSError, ValueError) as exc:
        hint = (
            ""
            if Path(model.tokenizer_dir).exists()
            else "; it is not a local folder, and as a Hugging Face id it needs hub access"
        )
        raise EvaluationError(
            f"model {model.spec}: cannot load its tokenizer from {model.tokenizer_dir} ({str(exc)[:300]}){hint}"
        ) from None
    prompts, stop = build_prompts(problems, protocol, tokenizer, params, data)
    settings = settings_from(params)
    settings.stop = stop
    gen: Generation = generate(model.model_dir, prompts, settings, backend, model.tokenizer_dir, tokenizer)
    items = [
        score_item(p, c, t, protocol)
        for p, c, t in zip(problems, gen.completions, gen.num_tokens, strict=True)
    ]
    metrics = {
        **summarize(items),
        "completions_per_second": gen.completions_per_second,
        "generation_seconds": gen.seconds,
        "load_seconds": gen.load_seconds,
        "backend": gen.backend,
        "protocol": protocol,
        "truncated_prompts": gen.truncated_prompts,
        "max_new_tokens": settings.max_new_tokens,
        "dtype": gen.details.get("dtype"),
        "model": model.spec,
        "data": data,
    }
    if gen.details.get("vllm_version"):
        metrics["vllm_version"] = gen.details["vllm_version"]
    log.info(
        "%s: accuracy_strict %.4f, accuracy_flexible %.4f, format_rate %.4f on %d items (%s, %.1f completions/s)",
        model.spec,
        metrics["accuracy_strict"],
        metrics["accuracy_flexible"],
        metrics["format_rate"],
        metrics["n"],
        gen.backend,
        metrics["completions_per_second"],
    )
    return metrics, items


# --------------------------------------------------------------------------- outputs


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def write_files(out_dir: str | os.PathLike, files: dict[str, bytes]) -> list[Path]:
    """Write every file into a temp folder beside `out_dir`, then move each into place.

    Nothing in `out_dir` changes until all files are written, so a failure leaves the
    previous reports as they were (other files in the folder are left alone).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".eval-tmp-", dir=out))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        for name in files:
            os.replace(tmp / name, out / name)
    finally:
        for leftover in tmp.iterdir():
            leftover.unlink()
        tmp.rmdir()
    return [out / name for name in files]


def report_files(
    results: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], comparison: dict[str, Any] | None
) -> dict[str, bytes]:
    files = {}
    for name, (metrics, items) in results.items():
        files[f"{name}.json"] = _dumps(metrics)
        files[f"{name}.items.jsonl"] = _jsonl(items)
    if comparison is not None:
        files["comparison.json"] = _dumps(comparison)
    return files


def log_to_mlflow(
    results: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]],
    comparison: dict[str, Any] | None,
    paths: list[Path],
    log_table: bool,
) -> None:
    """Metrics `<model>/<key>`, comparison numbers `<pair>/<key>`, report files and item tables."""
    import mlflow

    metrics = {}
    for name, (m, _) in results.items():
        for key, value in m.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"{name}/{key}"] = float(value)
            elif key.endswith("_ci95"):
                metrics[f"{name}/{key}_low"], metrics[f"{name}/{key}_high"] = map(float, value)
    for pair, res in (comparison or {}).items():
        for key in ("delta", "p_value"):
            metrics[f"{pair}/{key}"] = float(res[key])
        metrics[f"{pair}/ci95_low"], metrics[f"{pair}/ci95_high"] = map(float, res["ci95"])
    mlflow.log_metrics(metrics)
    backends = sorted({m["backend"] for m, _ in results.values()})
    mlflow.set_tags({"grpoflow.eval.backend": ",".join(backends)})
    for path in paths:
        mlflow.log_artifact(str(path), artifact_path="eval")
    if log_table:
        for name, (_, items) in results.items():
            columns = {key: [row[key] for row in items] for key in items[0]} if items else {}
            mlflow.log_table(data=columns, artifact_file=f"eval/{name}_items_table.json")


# --------------------------------------------------------------------------- the stage


def stage_models(params: Any) -> dict[str, str]:
    """{name: folder} of the models the stage evaluates, in report order."""
    models = {}
    if params.evaluate.include_base:
        models["base"] = params.model.base_dir
    models["sft"] = params.sft.output_dir
    models["grpo"] = params.grpo.output_dir
    return models


def comparisons(
    results: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], primary: str
) -> dict[str, Any]:
    pairs = [("grpo", "sft"), ("grpo", "base"), ("sft", "base")]
    return {
        f"{a}_vs_{b}": {"a": a, "b": b, **compare(results[a][1], results[b][1], primary)}
        for a, b in pairs
        if a in results and b in results
    }


def run(params: Any) -> dict[str, Any]:
    """Evaluate the stage's models, write the reports, return {model: metrics, 'comparison': ...}."""
    cfg = params.evaluate
    data = data_source(params)
    models = {}
    for name, path in stage_models(params).items():
        if not _is_hf_model_dir(Path(path)):
            stage = {"base": "model"}.get(name, name)
            raise EvaluationError(
                f"{name} model folder {path} is missing or has no config.json and *.safetensors; "
                f"run `dvc repro {stage}` first"
            )
        models[name] = resolve_model(path)
    problems = load_problems(data, cfg.limit)
    results = {
        name: evaluate_model(model, problems, params, protocol=cfg.protocol, backend=cfg.backend, data=data)
        for name, model in models.items()
    }
    comparison = comparisons(results, cfg.primary_metric)
    paths = write_files(cfg.output_dir, report_files(results, comparison))
    return {"results": results, "comparison": comparison, "paths": paths}


def _run_tracked(params: Any) -> dict[str, Any]:
    from components.tracking import stage_run

    with stage_run(STAGE, params):
        out = run(params)
        log_to_mlflow(out["results"], out["comparison"], out["paths"], params.evaluate.log_items_table)
    return out


def _summary(
    results: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], comparison: dict[str, Any] | None
) -> dict[str, Any]:
    keys = (
        "n",
        "accuracy_strict",
        "accuracy_flexible",
        "format_rate",
        "mean_completion_tokens",
        "completions_per_second",
        "backend",
    )
    summary: dict[str, Any] = {name: {k: m[k] for k in keys} for name, (m, _) in results.items()}
    for pair, res in (comparison or {}).items():
        summary[pair] = {k: res[k] for k in ("metric", "delta", "ci95", "p_value")}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.evaluate", description=__doc__.split("\n")[0])
    add_params_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        params = load_params(args.params, args.overrides)
        out = _run_tracked(params)
    except (ConfigError, EvaluationError, BackendError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(_summary(out["results"], out["comparison"]), indent=2))
    return 0


# --------------------------------------------------------------------------- grpoflow evaluate


def _slug(spec: str) -> str:
    """A file and MLflow-metric name for a model spec.

    >>> _slug("models:/grpoflow-policy@champion"), _slug("models/grpo/"), _slug("Qwen/Qwen2.5-0.5B-Instruct")
    ('grpoflow-policy-champion', 'grpo', 'Qwen2.5-0.5B-Instruct')
    """
    tail = spec.rstrip("/").split("/")[-1] or "model"
    return re.sub(r"[^\w.-]+", "-", tail)


def evaluate_one(
    params: Any,
    model_spec: str,
    *,
    data: str | None = None,
    protocol: str | None = None,
    backend: str | None = None,
    limit: int | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Evaluate one model (folder, hub id or models:/NAME@ALIAS) and log an MLflow run `evaluate`.

    Unset arguments come from `params.evaluate`; reports go to `output` (default
    `<evaluate.output_dir>/cli/<name>`). Returns the metrics with `output_dir` and `mlflow_run_id`.
    """
    from components.tracking import stage_run

    cfg = params.evaluate
    protocol = protocol or cfg.protocol
    backend = backend or cfg.backend
    limit = cfg.limit if limit is None else limit
    if limit < 0:
        raise EvaluationError(f"--limit must be >= 0, got {limit}")
    data = data_source(params, data)
    if not data.startswith(("jsonl:", "hf:")):
        raise EvaluationError(f"--data {data!r}: expected jsonl:PATH or hf:NAME[:CONFIG]")
    name = _slug(model_spec)
    out_dir = Path(output or Path(cfg.output_dir) / "cli" / name)
    extra = {
        "evaluate.model": model_spec,
        "evaluate.data": data,
        "evaluate.protocol": protocol,
        "evaluate.backend": backend,
        "evaluate.limit": limit,
    }
    with tempfile.TemporaryDirectory(prefix="grpoflow-model-") as tmp:
        # Bad input fails here, before an MLflow run is opened.
        model = resolve_model(model_spec, download_dir=tmp, params=params)
        problems = load_problems(data, limit)
        with stage_run(STAGE, params, extra_params=extra) as run_:
            import mlflow

            mlflow.set_tags({"grpoflow.eval.model": model_spec})
            metrics, items = evaluate_model(
                model, problems, params, protocol=protocol, backend=backend, data=data
            )
            results = {name: (metrics, items)}
            paths = write_files(out_dir, report_files(results, None))
            log_to_mlflow(results, None, paths, cfg.log_items_table)
    return {**metrics, "output_dir": str(out_dir), "mlflow_run_id": run_.info.run_id}


def cli_evaluate(args: argparse.Namespace) -> int:
    """`grpoflow evaluate`: one model (folder or MLflow URI) on a data source; prints the metrics JSON."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        params = load_params(args.params, args.overrides)
        metrics = evaluate_one(
            params,
            args.model,
            data=args.data,
            protocol=args.protocol,
            backend=args.backend,
            limit=args.limit,
            output=args.output,
        )
    except (ConfigError, EvaluationError, BackendError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
