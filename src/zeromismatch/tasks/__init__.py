"""RL tasks: the task protocol (base.py), datasets, prompts and rewards (``math``), a toy task, tokenizers
for tiny presets, and ``registry.build_task`` (the task a run's config names)."""
