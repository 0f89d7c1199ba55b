"""Training helpers of the sft and grpo stages: the shared TRL fine-tuning path, the rewards, the sample answers
and the GRPO signal monitor."""
