"""Shared helpers for tests/generator (imported by module name: the test directory is on sys.path)."""

import torch

from zeromismatch.generator import Engine

MICRO = dict(
    num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
)
VOCAB = MICRO["vocab_size"]


def prompts_of(lengths, seed=0, vocab=VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def run_all(eng: Engine, max_steps=10_000):
    """Step to completion; {request_id: (output, index of the step that finished it)}."""
    done = {}
    for step in range(max_steps):
        if not eng.has_work():
            return done
        for o in eng.step():
            assert o.request_id not in done, f"request {o.request_id} finished twice"
            done[o.request_id] = (o, step)
    raise AssertionError("engine did not finish")


def assert_same_outputs(a, b):
    """Same tokens and bit-identical fp32 logprobs, output by output."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.tokens == y.tokens, f"request {x.request_id}: tokens differ"
        assert torch.equal(x.logprob_tensor, y.logprob_tensor), f"request {x.request_id}: logprobs differ"
        assert x.finish_reason == y.finish_reason


def assert_no_leak(eng: Engine):
    """All requests done (or released): once the prefix cache drops its entries, every block is free."""
    assert not eng.has_work() and not eng.parked
    if eng.prefix is not None:
        eng.prefix.clear()
    assert eng.alloc.num_free() == eng.num_blocks
    assert all(r == 0 for r in eng.alloc.ref)
    assert len(set(eng.alloc.free)) == eng.num_blocks  # no block freed twice
    assert sorted(eng.free_slots) == list(range(eng.max_slots))
