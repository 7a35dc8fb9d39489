from .modes import MODES, Numerics, get_numerics

__all__ = ["MODES", "Numerics", "get_numerics"]
