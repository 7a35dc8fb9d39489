"""zeromismatch: bitwise trainer/generator parity for Gated DeltaNet hybrids, and what it is worth in async RL."""

__version__ = "0.1.0"
