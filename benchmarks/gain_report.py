"""The report half of benchmarks/grpo_gain.py: per-item verdicts paired across models, the numbers
of a slice (GRPO - SFT, GRPO - the continued-SFT control, exact McNemar), the band report, its
pooling over seeds, and `--rescore` (kept runs judged again with today's scorer).

Per band (`evaluate.target_band`, components/problems/bands.py), greedy flexible accuracy on the same items:
  target      the target band's problems (every problem without a target band): n,
              sft_accuracy_flexible, grpo_accuracy_flexible, control_accuracy_flexible, delta, ci95,
              p_value (exact McNemar, GRPO - SFT), delta_vs_control, p_vs_control (GRPO - control)
  in_band     the same numbers for every problem outside the target band, together
  all         the same numbers over every test problem, whatever its band
  bands       the same numbers per number of reasoning steps
  checked     inside each of them: the same numbers (`*_accuracy_checked`, delta, ci95, p_value, ...) on
              the right answers whose shown equations all hold (components/problems/arithmetic.py): a
              gain made of lucky answers after wrong arithmetic rises in flexible accuracy, not here

    python benchmarks/grpo_gain.py --rescore DIR/seed-1234 DIR/seed-2024   # kept runs, today's scorer
"""

from __future__ import annotations

import json
from pathlib import Path

CONTINUED = "sft_continued"  # the control's model folder and report names (models/, reports/train/)


def reports(workdir: Path, overrides: list[str]):
    """The params of the runs in `workdir` (paths of the stage reports)."""
    from pipelines.params.config import load_params

    return load_params(workdir / "params.yaml", overrides)


def item_rows(items: dict[str, list[dict]]) -> list[dict]:
    """One row per test item: its `steps` and each model's flexible verdict (`grpo`, `sft`, and
    `control` when the continued-SFT control ran), paired by id."""
    by_id = {name: {i["id"]: i for i in rows} for name, rows in items.items()}
    names = {key: name for key, name in {"grpo": "grpo", "sft": "sft", "control": CONTINUED}.items() if name in by_id}
    # `<key>_checked` too (right with no wrong equation) where every items file has the column
    columns = {"": "correct_flexible"}
    if all("correct_checked" in i for group in items.values() for i in group):
        columns["_checked"] = "correct_checked"
    return [{"steps": i.get("steps"), **{key + suffix: by_id[name][i["id"]][column]
                                         for key, name in names.items() for suffix, column in columns.items()}}
            for i in items["grpo"] if all(i["id"] in by_id[name] for name in by_id)]


def slice_numbers(rows: list[dict]) -> dict:
    """GRPO - SFT (and GRPO - control) greedy flexible accuracy on `rows`, exact McNemar p-values.

    >>> r = slice_numbers([{"grpo": True, "sft": False, "control": False}] * 6
    ...                   + [{"grpo": True, "sft": True, "control": True}] * 4)
    >>> r["n"], r["delta"], round(r["p_value"], 4), r["delta_vs_control"]
    (10, 0.6, 0.0312, 0.6)
    >>> rows = [{"grpo": True, "sft": False, "grpo_checked": False, "sft_checked": False}] * 6
    >>> r = slice_numbers(rows)["checked"]
    >>> r["grpo_accuracy_checked"], r["delta"], r["p_value"]
    (0.0, 0.0, 1.0)
    """
    from components.evaluation.stats import compare_paired

    res = compare_paired([r["grpo"] for r in rows], [r["sft"] for r in rows])
    out = {"n": res["n"], "sft_accuracy_flexible": res["accuracy_b"], "grpo_accuracy_flexible": res["accuracy_a"]}
    if rows and all("control" in r for r in rows):
        ctl = compare_paired([r["grpo"] for r in rows], [r["control"] for r in rows])
        out["control_accuracy_flexible"] = ctl["accuracy_b"]
    out.update(delta=res["delta"], ci95=res["ci95"], p_value=res["p_value"])
    if "control_accuracy_flexible" in out:
        out.update(delta_vs_control=ctl["delta"], p_vs_control=ctl["p_value"])
    if rows and all("grpo_checked" in r and "sft_checked" in r for r in rows):
        # the same on the right answers whose shown equations all hold: a gain from guesses has none here
        checked = slice_numbers([{key: r[f"{key}_checked"] for key in ("grpo", "sft", "control")
                                  if f"{key}_checked" in r}
                                 for r in rows])
        out["checked"] = {k.replace("_flexible", "_checked"): v for k, v in checked.items() if k != "n"}
    return out


def band_report(rows: list[dict], target_band: str) -> dict:
    """`target` (the evaluate.target_band problems; every problem without one), `in_band` (every other
    problem together), `all` (every problem) and `bands` (per step count), each with `slice_numbers`.

    >>> rows = [{"steps": 1, "grpo": True, "sft": True}] * 4 + [{"steps": 3, "grpo": True, "sft": False}] * 2
    >>> r = band_report(rows, "3")
    >>> r["target"]["n"], r["target"]["delta"], r["in_band"]["delta"], r["all"]["n"], round(r["all"]["delta"], 3)
    (2, 1.0, 0.0, 6, 0.333)
    >>> sorted(r["bands"])
    ['1', '3']
    """
    from components.problems.bands import by_steps, parse_band, split_items

    band = parse_band(target_band)
    target, rest = split_items(rows, band) if band else (rows, [])
    out = {"target_band": target_band or "all", "target": slice_numbers(target)}
    if rest:
        out["in_band"] = slice_numbers(rest)
    out["all"] = slice_numbers(rows)
    out["bands"] = {key: slice_numbers(group) for key, group in by_steps(rows).items()}
    return out


def pooled(per_seed: list[list[dict]], target_band: str) -> dict:
    """The band report over every seed's paired items (each seed has its own test split, so the items
    are distinct), with the exact McNemar p-values; the old top-level keys are the target band's.

    >>> r = pooled([[{"steps": 3, "grpo": True, "sft": False}] * 6 + [{"steps": 3, "grpo": True, "sft": True}] * 4,
    ...             [{"steps": 3, "grpo": False, "sft": False}] * 10], "3")
    >>> r["n"], r["delta"], round(r["p_value"], 4), r["target"]["n"]
    (20, 0.3, 0.0312, 20)
    """
    report = band_report([row for rows in per_seed for row in rows], target_band)
    t = report["target"]
    return {**{k: t[k] for k in ("delta", "ci95", "p_value", "n", "sft_accuracy_flexible", "grpo_accuracy_flexible")},
            **report}


def rescore(folders: list[Path], grpo_items: str = "grpo", overrides: list[str] | None = None) -> dict:
    """The band report of kept runs (`--keep DIR`: DIR or DIR/seed-S) with today's scorer: every kept
    greedy completion in `items/` judged again (components/evaluation/scoring.py judge), so a metric
    added since (`checked`) is reported for runs made before it. Pooled when there are several. The
    target band is the folder's params.yaml with `overrides` (the -S the runs were made with)."""
    from components.evaluation.scoring import judge

    runs, per_seed = [], []
    for folder in folders:
        items = {}
        for name, stem in (("grpo", grpo_items), ("sft", "sft"), (CONTINUED, CONTINUED)):
            path = folder / "items" / f"{stem}.jsonl"
            if not path.is_file():
                if name == CONTINUED:
                    continue
                raise SystemExit(f"grpo_gain --rescore: {path} not found (a folder kept with --keep holds items/)")
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            items[name] = [{**row, **judge(row["completion"], row["gold"], "grpoflow")} for row in rows]
        band = reports(folder, overrides or []).evaluate.target_band
        rows = item_rows(items)
        runs.append({"folder": str(folder), **band_report(rows, band)})
        per_seed.append(rows)
    result: dict = {"seeds": runs}
    if len(runs) > 1:
        result["pooled"] = pooled(per_seed, runs[0]["target_band"] if runs[0]["target_band"] != "all" else "")
    return result
