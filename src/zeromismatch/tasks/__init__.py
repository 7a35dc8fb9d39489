"""RL tasks: datasets, prompts and rewards (``math``), and tokenizers for tiny presets."""
