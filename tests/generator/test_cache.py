"""The paged KV cache: a call's new tokens land in their sequence's block at their offset, in every attention layer,
and read_kv returns them at their positions; nothing else is written."""

import dataclasses

import torch

from zeromismatch.generator.cache import BLOCK_SIZE, BatchCacheView, CacheStorage
from zeromismatch.ops.varlen import SeqLayout


def test_write_kv_rows_per_call_and_layer(micro_model):
    model = micro_model("bi")
    cfg = dataclasses.replace(model.config, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2)
    st = CacheStorage(cfg, model.numerics.gdn, max_slots=2, num_blocks=6)
    layers = sorted(st.k)
    assert len(layers) == 2
    hkv, d = st.k[layers[0]].shape[2:]
    tables = [[4, 1], [2]]
    gen = torch.Generator().manual_seed(0)
    # two calls through two views: seq 0 brings 2 tokens at 63, 64 (across its blocks), seq 1 one token at 5; then
    # one decode token each
    for starts, lens in (([63, 5], [2, 1]), ([65, 6], [1, 1])):
        cu = [0, lens[0], lens[0] + lens[1]]
        layout = SeqLayout.build(cu, starts)
        view = BatchCacheView(st, [0, 1], tables)
        written = {}
        for i in layers:
            k, v = torch.randn(cu[-1], hkv, d, generator=gen), torch.randn(cu[-1], hkv, d, generator=gen)
            view.write_kv(i, k, v, layout)
            written[i] = (k, v)
        for i, (k, v) in written.items():
            row = 0
            for b, (s, n) in enumerate(zip(starts, lens)):
                for p in range(s, s + n):
                    block = tables[b][p // BLOCK_SIZE]
                    assert torch.equal(st.k[i][block, p % BLOCK_SIZE], k[row])
                    assert torch.equal(st.v[i][block, p % BLOCK_SIZE], v[row])
                    row += 1
    # only the 5 written positions are nonzero, in every layer; read_kv returns them at their positions
    for i in layers:
        assert int((st.k[i].abs().sum((2, 3)) != 0).sum()) == 5
    layout = SeqLayout.build([0, 1, 2], [65, 6])
    kk, vv = BatchCacheView(st, [0, 1], tables).read_kv(layers[0], layout)
    assert torch.equal(kk[0, 63:66], torch.stack([st.k[layers[0]][4, 63], st.k[layers[0]][1, 0], st.k[layers[0]][1, 1]]))
    assert torch.equal(vv[1, 5:7], st.v[layers[0]][2, 5:7])
