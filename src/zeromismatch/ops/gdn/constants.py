"""The GDN chunk length, one constant for every chunked form (torch, Triton, the chunk-aligned decode). The
generator's cache blocks are a multiple of it (generator/cache.py asserts this), so a prefix-cache hit lands on
a chunk boundary, where bi_chunk's open chunk is empty."""

CHUNK = 64

# bi_chunk's CUDA decode kernels (chunk_triton.py says what each computes); conf/numerics `chunk_decode` picks one
CHUNK_DECODE_KERNELS = ("chain", "dot", "chain_mul_add")
DEFAULT_CHUNK_DECODE = "chain"
