"""Op families. Each folder holds the plain-torch CPU form beside its CUDA (Triton) form; the CUDA modules are
imported lazily (CPU machines have no triton) and are tested against the torch forms.

- device.py      which form a tensor takes (on_gpu), CUDA settings the invariant kernels assume
- varlen.py      packed <-> padded token layouts of a varlen call (SeqLayout)
- linear/        batch-invariant GEMM and bmm (the `bi` / `bi_chunk` projections and attention matmuls)
- reduce/        row-count-invariant row reductions (norms)
- fused/         norms, GDN gates and q / k l2 norm, RoPE, act(gate) * x: one row-invariant CUDA kernel each
- activations.py batch-invariant sigmoid / silu / softplus
- triton_math.py what the Triton kernels share: the EXACT launch option (no FMA contraction), sigmoid / silu
- conv/          causal depthwise conv: one implementation for the full sequence and the one-token step
- gdn/           gated delta rule: the reference forms, one backend per GDN form, the Triton kernels
- attention/     causal GQA attention: a batch-invariant blocked form and the stock SDPA form
- moe/           routed experts: grouped by expert, Triton grouped GEMMs (invariant) or torch._grouped_mm (stock)
- logprob.py     the one token-logprob op shared by trainer and generator
- gumbel.py      the generator's device sampler: counter-based hash noise keyed by (seed, position), Gumbel-max
"""
