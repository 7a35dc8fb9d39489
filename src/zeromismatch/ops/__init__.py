"""Op families. Each folder holds a plain-torch reference; fast kernels live beside it and are tested against it.

- invariant.py   batch-invariant building blocks (linear, activations) for the `bi` / `bi_chunk` modes
- conv.py        causal depthwise conv: one implementation for the full sequence and the one-token step
- gdn/           gated delta rule: recurrent and chunked forms, varlen, states in fp32
- attention/     causal GQA attention: a batch-invariant blocked form and the stock SDPA form
- logprob.py     the one token-logprob op shared by trainer and generator
"""
