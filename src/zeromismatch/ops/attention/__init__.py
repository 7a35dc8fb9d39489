from .reference import BLOCK, TILE, blocked_attention, sdpa_attention

__all__ = ["BLOCK", "TILE", "blocked_attention", "sdpa_attention"]
