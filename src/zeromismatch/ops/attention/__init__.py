from .reference import BLOCK, blocked_attention, sdpa_attention

__all__ = ["BLOCK", "blocked_attention", "sdpa_attention"]
