"""Tests of components/training/rewards.py: a table per reward, the registry and params wiring, and
the robustness claims (hypothesis properties; 10,000 random plus adversarial strings through
every registered reward with no exception and no call over 50 ms of CPU time).

    pytest -q tests/test_rewards.py
"""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.reward_latency import GOLDS, adversarial_strings, measure, random_strings
from components.problems.gsm8k import format_target
from components.training import rewards
from components.training.rewards import (
    REWARD_FUNCS,
    accuracy_reward,
    build_rewards,
    check_reward_names,
    flexible_accuracy_reward,
    format_reward,
    get_reward_funcs,
    seed_combined_reward,
    soft_format_reward,
    tag_count_reward,
)
from pipelines.params.config import ConfigError, load_params

CURTIS_REASONING = "Mr. Curtis has 325 - 28 = 297 hens.\nOnly 297 - 20 = 277 hens lay eggs."
RIGHT = format_target(CURTIS_REASONING, "277")
WRONG = format_target(CURTIS_REASONING, "305")
PROSE_RIGHT = CURTIS_REASONING + "\nThe answer is 277."
SOFT = "Let me think. <reasoning>297 - 20 = 277</reasoning> so <answer>277</answer> done"
TAGS_ONLY_ANSWER = "<answer>277</answer>"
UNCLOSED = "<reasoning>325 - 28 = 297"


def chat(text):
    return [{"role": "assistant", "content": text}]


# completion, format, soft_format, accuracy, seed_combined, tag_count, flexible_accuracy   (gold 277)
TABLE = [
    (RIGHT, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    (WRONG, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0),
    (format_target(CURTIS_REASONING, "$277.00"), 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    (format_target(CURTIS_REASONING, "277 hens"), 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    (format_target(CURTIS_REASONING, "277 or 305"), 1.0, 1.0, 0.0, 0.5, 1.0, 0.0),
    ("<reasoning>x</reasoning><answer>277</answer>", 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    (PROSE_RIGHT, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0),  # the instruct model's way: no tags, the number last
    (PROSE_RIGHT + " Next year he buys 5 more.", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # a later number is the answer
    (SOFT, 0.0, 1.0, 0.0, 0.0, 0.25, 1.0),  # only </reasoning> is well placed
    (TAGS_ONLY_ANSWER, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0),
    (UNCLOSED, 0.0, 0.0, 0.0, 0.0, 0.25, 0.0),
    (RIGHT + "\nextra", 0.0, 1.0, 0.0, 0.0, 0.75, 1.0),
    (RIGHT + RIGHT, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0),
    ("<reasoning>x</reasoning><answer></answer>", 0.0, 1.0, 0.0, 0.0, 1.0, 0.0),
    ("", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("as_chat", [False, True], ids=["string", "chat"])
@pytest.mark.parametrize("completion, fmt, soft, acc, combined, tags, flex", TABLE)
def test_each_reward_scores_the_table_of_completions_as_strings_and_as_chat(
    completion, fmt, soft, acc, combined, tags, flex, as_chat
):
    c = [chat(completion) if as_chat else completion]
    gold = ["277"]
    assert format_reward(c, gold=gold) == [fmt]
    assert soft_format_reward(c, gold=gold) == [soft]
    assert accuracy_reward(c, gold=gold) == [acc]
    assert seed_combined_reward(c, gold=gold) == [combined]
    assert tag_count_reward(c, gold=gold) == [tags]
    assert flexible_accuracy_reward(c, gold=gold) == [flex]


def test_rewards_score_a_batch_row_by_row_with_its_own_gold():
    completions = [RIGHT, WRONG, format_target("x", "12")]
    golds = ["277", "305", "12"]
    assert accuracy_reward(completions, gold=golds) == [1.0, 1.0, 1.0]
    assert seed_combined_reward(completions, gold=["277", "277", "277"]) == [1.0, 0.5, 0.5]
    # TRL passes every dataset column; extra ones are ignored.
    assert accuracy_reward(
        completions, gold=golds, prompts=["p"] * 3, question=["q"] * 3, id=["1", "2", "3"]
    ) == [1.0, 1.0, 1.0]


def test_missing_gold_gives_none_and_a_missing_column_is_a_clear_error():
    assert accuracy_reward([RIGHT, RIGHT], gold=[None, "277"]) == [None, 1.0]
    assert seed_combined_reward([RIGHT], gold=[None]) == [None]
    assert flexible_accuracy_reward([PROSE_RIGHT, PROSE_RIGHT], gold=[None, "277"]) == [None, 1.0]
    with pytest.raises(KeyError, match="'gold' column"):
        accuracy_reward([RIGHT], answer=["#### 277"])


def test_rewards_read_chat_content_parts_and_score_odd_objects_zero():
    parts = [{"role": "assistant", "content": [{"type": "text", "text": RIGHT}]}]
    assert seed_combined_reward([parts], gold=["277"]) == [1.0]
    odd = [None, 42, [], [None], {"content": None}, [{"role": "assistant"}], b"<answer>277</answer>"]
    for func in REWARD_FUNCS.values():
        assert func(odd, gold=["277"] * len(odd)) == [0.0] * len(odd)


# --------------------------------------------------------------------------- registry and params


def test_rewards_are_registered_by_name_and_trl_sees_their_function_names():
    assert list(REWARD_FUNCS) == ["format", "soft_format", "accuracy", "seed_combined", "tag_count",
                                  "flexible_accuracy"]
    assert [f.__name__ for f in get_reward_funcs(list(REWARD_FUNCS))] == [
        "format_reward",
        "soft_format_reward",
        "accuracy_reward",
        "seed_combined_reward",
        "tag_count_reward",
        "flexible_accuracy_reward",
    ]


def test_unknown_reward_lists_the_known_ones():
    with pytest.raises(ValueError) as exc:
        get_reward_funcs(["format", "acuracy"])
    msg = str(exc.value)
    assert "'acuracy'" in msg
    for name in REWARD_FUNCS:
        assert name in msg
    assert "package.module:function" in msg


def test_dotted_path_loads_a_users_reward(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length_penalty(completions, **kwargs):\n"
        "    return [-len(c) / 1000 for c in completions]\n"
        "NOT_A_FUNCTION = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    (func,) = get_reward_funcs(["my_rewards:length_penalty"])
    assert func(["ab", "abcd"]) == [-0.002, -0.004]
    with pytest.raises(ValueError, match="no function 'missing'"):
        get_reward_funcs(["my_rewards:missing"])
    with pytest.raises(ValueError, match="no function 'NOT_A_FUNCTION'"):
        get_reward_funcs(["my_rewards:NOT_A_FUNCTION"])
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        get_reward_funcs(["no_such_module_xyz:f"])


def test_params_choose_rewards_with_weights():
    params = load_params(
        None,
        [
            "rewards.funcs=[format, accuracy, components.training.rewards:tag_count_reward]",
            "rewards.weights=[0.2, 1.0, 0.1]",
        ],
    )
    funcs, weights = build_rewards(params.rewards)
    assert funcs == [format_reward, accuracy_reward, tag_count_reward]
    assert weights == [0.2, 1.0, 0.1]
    default = load_params(None, [])
    # the default recipe: correctness alone, tags or not
    assert [f.__name__ for f in build_rewards(default.rewards)[0]] == ["flexible_accuracy_reward"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rewards.funcs=[format, accuracy]"], r"rewards.weights: 1 weights for 2 funcs"),
        (["rewards.weights=[1.0, 2.0]"], r"rewards.weights: 2 weights for 1 funcs"),
        (["rewards.funcs=[]", "rewards.weights=[]"], r"rewards.funcs: give at least one"),
        (["rewards.weights=[.nan]"], r"rewards.weights\[0\]: expected a finite number"),
        (["rewards.weights=[x]"], r"rewards.weights\[0\]: expected a number"),
    ],
)
def test_bad_reward_params_fail_with_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_params(None, overrides)


def test_unknown_reward_name_fails_before_grpo_loads_anything():
    """Reward names are checked where rewards are used (the grpo stage, and `grpoflow run` through
    grpo.trainer_settings), not by the params schema that every stage loads."""
    from components import grpo

    params = load_params(None, ["rewards.funcs=[format, nope]", "rewards.weights=[1, 1]"])
    with pytest.raises(ConfigError, match=r"rewards.funcs\[1\]: unknown reward 'nope'; known rewards: format"):
        check_reward_names(params.rewards)
    with pytest.raises(ConfigError, match=r"rewards.funcs\[1\]: unknown reward 'nope'"):
        grpo.trainer_settings(params)
    check_reward_names(
        load_params(None, ["rewards.funcs=[format, mypkg.mod:reward]", "rewards.weights=[1, 1]"]).rewards)


# --------------------------------------------------------------------------- robustness

TAG_SOUP = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "<reasoning>",
                "</reasoning>",
                "<answer>",
                "</answer>",
                "\n",
                " ",
                "####",
                "A: ",
                "$",
                ",",
                ".",
                "-",
                "\\frac{",
                "}",
                "{",
                "^",
                "/",
            ]
        ),
        st.from_regex(r"-?\$?[0-9]{1,30}([.,][0-9]{1,5})?", fullmatch=True),
        st.text(max_size=20),
    ),
    max_size=40,
).map("".join)
COMPLETION = st.one_of(st.text(max_size=300), TAG_SOUP, TAG_SOUP.map(lambda s: format_target(s, s[:12])))
GOLD = st.one_of(
    st.none(), st.sampled_from(["277", "0.5", "-3", "1000"]), st.text(max_size=15), st.integers().map(str)
)


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    completions=st.lists(st.one_of(COMPLETION, COMPLETION.map(chat)), min_size=1, max_size=4), data=st.data()
)
def test_property_rewards_are_total_bounded_and_consistent(completions, data):
    golds = data.draw(st.lists(GOLD, min_size=len(completions), max_size=len(completions)))
    out = {name: f(completions, gold=golds) for name, f in REWARD_FUNCS.items()}
    for name, scores in out.items():
        assert len(scores) == len(completions), name
    for i, gold in enumerate(golds):
        fmt, soft, acc = out["format"][i], out["soft_format"][i], out["accuracy"][i]
        combined, tags = out["seed_combined"][i], out["tag_count"][i]
        assert fmt in (0.0, 1.0) and soft in (0.0, 1.0)
        assert 0.0 <= tags <= 1.0 and tags * 4 == int(tags * 4)
        assert fmt <= soft  # the strict format is a soft format
        if fmt == 1.0:
            assert tags == 1.0
        if gold is None:
            assert acc is None and combined is None
        else:
            assert acc in (0.0, 1.0)
            assert acc <= fmt  # accuracy is judged on the strict format's answer
            assert combined == (0.0 if fmt == 0.0 else 0.5 + 0.5 * acc)


def test_random_and_adversarial_strings_never_raise_and_stay_within_50ms():
    """The issue's claim: 10,000 random and adversarial strings through every registered
    reward, no exception, none slower than 50 ms. Measured as CPU time of this thread less
    garbage-collector pauses: that is what the rewards control (wall time on a shared CI
    machine adds other processes' time, and a full collection costs in proportion to the
    whole test process's heap). benchmarks/reward_latency.py reports all three."""
    get_reward_funcs(list(REWARD_FUNCS))  # warm math-verify, as training does
    texts = random_strings(10_000, seed=0) + adversarial_strings()
    rng = random.Random(1)
    golds = [rng.choice(GOLDS) for _ in texts]
    worst = {}
    for name, func in REWARD_FUNCS.items():
        scores = func(texts[:50], gold=golds[:50])  # also once as a batch
        assert len(scores) == 50
        _, cpu, in_gc = measure(func, texts, golds)  # one call per string; raises if a call raises
        worst[name] = max(c - g for c, g in zip(cpu, in_gc, strict=True))
    assert max(worst.values()) < 50.0, worst


@pytest.mark.parametrize("name", list(REWARD_FUNCS))
def test_adversarial_strings_get_valid_scores(name):
    texts = adversarial_strings()
    scores = REWARD_FUNCS[name](texts, gold=["277"] * len(texts))
    assert len(scores) == len(texts)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores)


def test_rewards_module_does_no_work_at_import():
    # Importing rewards must not import math-verify or sympy (`grpoflow run` imports it to check names).
    import subprocess

    code = ("import sys, components.training.rewards, pipelines.params.config; "
            "print('sympy' in sys.modules, 'math_verify' in sys.modules)")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(rewards.__file__).rsplit("/components/", 1)[0],
    )
    assert out.stdout.split() == ["False", "False"]
