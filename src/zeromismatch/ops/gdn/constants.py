"""The GDN chunk length, one constant for every chunked form (torch, Triton, the chunk-aligned decode). The
generator's cache blocks are a multiple of it (generator/cache.py asserts this), so a prefix-cache hit lands on
a chunk boundary, where bi_chunk's open chunk is empty."""

CHUNK = 64

# bi_chunk's chunked arithmetic on CUDA, trainer and generator alike (chunk_triton.py says what each computes);
# conf/numerics `chunk_dots` picks one: tensor-core tf32 products, or every sum an fp32 FMA chain
CHUNK_DOTS = ("tf32", "ieee")
DEFAULT_CHUNK_DOTS = "tf32"
