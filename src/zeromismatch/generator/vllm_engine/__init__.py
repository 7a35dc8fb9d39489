"""vLLM generator backends (optional: pip install -e ".[vllm]", scripts/install_vllm.sh)."""
