"""The `lm-eval-gsm8k` evaluation protocol: lm-evaluation-harness's `gsm8k` task, reproduced.

The harness's task (lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0) is:

- prompt: 5 solved train problems, then the test problem, each as
  `Question: {question}\\nAnswer:`; a solved one is followed by `" " + answer + "\\n\\n"`,
  where `answer` is GSM8K's full answer text (calculator annotations and `#### N` line
  included). No chat template, no system prompt.
- few-shot examples: the harness's default sampler, i.e. ONE `random.Random(1234)` for
  the whole run that draws `sample(train_docs, 5)` for each test problem in test order
  (not the first 5 train problems; `--limit N` keeps the first N test problems, so their
  examples are the same as in a full run).
- greedy decoding, generation stops at `Question:`, `</s>` or `<|im_end|>` (and EOS);
  the continuation is cut before the first of them.
- filters: `strict-match` takes the first `#### (-?[0-9.,]+)`; `flexible-extract` takes
  the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`; no match gives `[invalid]`.
- metric `exact_match`: prediction and reference lose `,`, `$`, everything up to
  `#### ` and a trailing `.`, are lower-cased and compared as strings.

Numbers from this protocol can be set beside published lm-eval gsm8k figures (e.g.
Qwen2.5-0.5B-Instruct: 49.6 on GSM8K) when run on `hf:openai/gsm8k:main`.

The few-shot examples come from the test data's own train split (`choose_fewshot_source`):
`evaluate.fewshot_source` when set; else an `hf:` source's train split, the prepared train
split for the prepared test split, or the `train.jsonl` beside a `jsonl:DIR/X.jsonl` file
(GSM8K's own layout); else an error that names `evaluate.fewshot_source`. Given GSM8K's
train split, `build_fewshot_prompts` builds exactly the harness's contexts (tests/slow/test_lm_eval_harness.py
runs the harness itself beside it).

    python -m doctest components/evaluation/lm_eval_gsm8k.py
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from components.common.errors import EvaluationError

NUM_FEWSHOT = 5
FEWSHOT_SEED = 1234
STOP_SEQUENCES = ("Question:", "</s>", "<|im_end|>")
TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
INVALID = "[invalid]"

_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE_RES = [re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$")]


@dataclass(frozen=True)
class FewshotSource:
    """Where the few-shot examples come from: `source`'s `split`, and the rule that chose it."""

    source: str  # jsonl:PATH or hf:NAME[:CONFIG]
    split: str
    rule: str

    def describe(self) -> str:
        where = self.source if self.source.startswith("jsonl:") else f"{self.source} ({self.split} split)"
        return f"{where}, {self.rule}"


def _jsonl_path(source: str) -> Path | None:
    return Path(source[len("jsonl:") :]) if source.startswith("jsonl:") and len(source) > len("jsonl:") else None


def choose_fewshot_source(explicit: str, data: str, prepared_dir: str) -> FewshotSource:
    """The few-shot source a user expects for the test data `data`, first rule that applies:

    1. `explicit` (evaluate.fewshot_source), when set;
    2. an `hf:NAME[:CONFIG]` source: its own train split (the harness's `fewshot_split`);
    3. the prepared test split (`jsonl:PREPARED_DIR/test.jsonl`): the prepared train split;
    4. `jsonl:DIR/X.jsonl`: `jsonl:DIR/train.jsonl` when that file exists and is not X.jsonl itself.

    Anything else is refused, naming evaluate.fewshot_source.

    >>> choose_fewshot_source("", "hf:openai/gsm8k:main", "data/processed").describe()
    'hf:openai/gsm8k:main (train split), the train split of the data source'
    >>> choose_fewshot_source("", "jsonl:data/processed/test.jsonl", "data/processed").source
    'jsonl:data/processed/train.jsonl'
    """
    if explicit:
        return FewshotSource(explicit, "train", "set by evaluate.fewshot_source")
    if data.startswith("hf:"):
        return FewshotSource(data, "train", "the train split of the data source")
    path = _jsonl_path(data)
    if path is not None:
        prepared = Path(prepared_dir) / "test.jsonl"
        if path.resolve() == prepared.resolve():
            return FewshotSource(f"jsonl:{prepared.parent / 'train.jsonl'}", "train", "the prepared train split")
        beside = path.parent / "train.jsonl"
        if beside.is_file() and beside.resolve() != path.resolve():
            return FewshotSource(f"jsonl:{beside}", "train", "the train.jsonl beside the test file")
        why = "it is the test file itself" if beside.resolve() == path.resolve() else "no such file"
        raise EvaluationError(
            f"lm-eval-gsm8k takes its few-shot examples from a train split, and --data {data} has none "
            f"({beside}: {why}): set -S evaluate.fewshot_source=jsonl:PATH (GSM8K's train.jsonl, as the "
            "harness uses) or hf:NAME[:CONFIG], or -S evaluate.num_fewshot=0"
        )
    raise EvaluationError(
        f"lm-eval-gsm8k: no train split known for --data {data!r}: set -S evaluate.fewshot_source=jsonl:PATH "
        "or hf:NAME[:CONFIG]"
    )


def doc_to_text(question: str) -> str:
    r"""The harness's per-problem text.

    >>> doc_to_text("What is 2 + 3?")
    'Question: What is 2 + 3?\nAnswer:'
    """
    return f"Question: {question}\nAnswer:"


def fewshot_context(examples: Sequence[dict[str, str]]) -> str:
    r"""The solved examples, each `Question: q\nAnswer: a\n\n`.

    >>> fewshot_context([{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    'Question: 1+1?\nAnswer: 1+1=2\n#### 2\n\n'
    """
    return "".join(
        doc_to_text(ex["question"]) + TARGET_DELIMITER + ex["answer"] + FEWSHOT_DELIMITER for ex in examples
    )


def build_fewshot_prompts(
    questions: Sequence[str],
    fewshot_docs: Sequence[dict[str, str]],
    num_fewshot: int = NUM_FEWSHOT,
    seed: int = FEWSHOT_SEED,
) -> list[str]:
    """One prompt per question, the few-shot examples drawn as the harness draws them.

    `fewshot_docs` are the train problems in split order, each {"question", "answer"} with
    GSM8K's full answer text.

    >>> docs = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(10)]
    >>> p = build_fewshot_prompts(["x", "y"], docs, num_fewshot=2, seed=1234)
    >>> [line for line in p[0].splitlines() if line.startswith("Question")]
    ['Question: q7', 'Question: q1', 'Question: x']
    """
    if num_fewshot > len(fewshot_docs):
        raise ValueError(
            f"{num_fewshot}-shot prompts need {num_fewshot} few-shot examples, got {len(fewshot_docs)}"
        )
    rnd = random.Random(seed)
    prompts = []
    for question in questions:
        shots = rnd.sample(list(fewshot_docs), num_fewshot) if num_fewshot else []
        prompts.append(fewshot_context(shots) + doc_to_text(question))
    return prompts


def extract(text: str, mode: str) -> str:
    """The harness's `strict-match` (first `#### N`) or `flexible-extract` (last number).

    >>> extract("so 3 * 4 = 12.\\n#### 12", "strict"), extract("so 3 * 4 = 12.\\n#### 12", "flexible")
    ('12', '12')
    >>> extract("It costs $1,250.", "flexible"), extract("no number", "flexible"), extract("7", "strict")
    ('$1,250.', '[invalid]', '[invalid]')
    """
    if mode == "strict":
        matches = _STRICT_RE.findall(text)
        pick = matches[0] if matches else None
    elif mode == "flexible":
        matches = _FLEXIBLE_RE.findall(text)
        pick = matches[-1] if matches else None
    else:
        raise ValueError(f"unknown mode {mode!r}; expected 'strict' or 'flexible'")
    if pick is None:
        return INVALID
    if isinstance(pick, tuple):
        pick = next((m for m in pick if m), "")
    return pick.strip()


def _clean(text: str) -> str:
    for pattern in _IGNORE_RES:
        text = pattern.sub("", text)
    return text.lower()


def exact_match(prediction: str, reference: str) -> bool:
    """The harness's exact_match with the task's `regexes_to_ignore` and `ignore_case`.

    `reference` may be GSM8K's full answer or just the gold number.

    >>> exact_match("$1,000.", "so 10 * 100 = 1000\\n#### 1000"), exact_match("1000.0", "1000")
    (True, False)
    """
    return _clean(prediction) == _clean(reference)
