"""Numerics from a mode name, a mapping or a conf/numerics node; the kernel policies travel from the config
into the kernels (stubbed here: CPU machines have no triton); describe() lists them for the run logs."""

import sys
import types
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.numerics import MODES, get_numerics
from zeromismatch.ops import linear as linear_ops
from zeromismatch.ops.gdn import AlignedChunkGDN, ChunkGDN, GDNHeads, RecurrentGDN, aligned_chunk
from zeromismatch.ops.varlen import SeqLayout

CONF = Path(__file__).resolve().parents[2] / "conf" / "numerics"


def test_names_pick_backends_and_default_policies():
    backends = {"stock": ChunkGDN, "bi": RecurrentGDN, "bi_chunk": AlignedChunkGDN}
    for mode in MODES:
        nx = get_numerics(mode)
        assert type(nx.gdn) is backends[mode]
        experts = "grouped_mm/cpu_torch" if mode == "stock" else "triton_grouped/cpu_rows"
        assert nx.describe() == {"name": mode, "gdn": nx.gdn.name, "experts": experts, "gemm_policy": "adaptive",
                                 "chunk_dots": "tf32", "lm_head": "tensor_core"}
        assert get_numerics(nx) is nx


@pytest.mark.parametrize("mode", MODES)
def test_conf_numerics_nodes(mode):
    node = OmegaConf.load(CONF / f"{mode}.yaml")
    nx = get_numerics(node)
    assert nx.describe() == {"name": mode, "gdn": nx.gdn.name, "experts": nx.experts.name, "gemm_policy": node.gemm_policy,
                             "chunk_dots": node.chunk_dots, "lm_head": node.lm_head}


def test_mapping_sets_policies_and_rejects_unknown():
    nx = get_numerics(OmegaConf.create({"name": "bi_chunk", "gemm_policy": "fixed", "chunk_dots": "ieee",
                                        "lm_head": "fp32"}))
    assert nx.describe() == {"name": "bi_chunk", "gdn": "aligned_chunk", "experts": "triton_grouped/cpu_rows",
                             "gemm_policy": "fixed", "chunk_dots": "ieee", "lm_head": "fp32"}
    assert nx.gdn.dots == "ieee"
    for bad in ({"name": "bi", "gemm_policy": "fastest"}, {"name": "bi", "chunk_dots": "x"}, {"name": "bi", "lm_head": "bf16"},
                {"name": "bi", "policy": "fixed"},
                {"name": "nope"}):
        with pytest.raises(ValueError):
            get_numerics(bad)
    model = build_model("tiny", {"name": "bi", "gemm_policy": "hybrid"}, num_hidden_layers=1, layer_types=["linear_attention"])
    assert model.numerics.describe()["gemm_policy"] == "hybrid"


def test_gemm_policy_reaches_the_cuda_gemm(monkeypatch):
    seen = []
    stub = types.ModuleType("zeromismatch.ops.linear.triton")
    stub.linear = lambda x, w, policy: seen.append(policy) or x @ w.t()
    monkeypatch.setitem(sys.modules, "zeromismatch.ops.linear.triton", stub)
    monkeypatch.setattr(linear_ops.dispatch, "on_gpu", lambda x: True)
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    for policy in ("fixed", "hybrid"):
        get_numerics({"name": "bi", "gemm_policy": policy}).linear(x, w)
    assert seen == ["fixed", "hybrid"]


def test_chunk_dots_reach_the_decode_kernel(monkeypatch):
    seen = []
    stub = types.ModuleType("zeromismatch.ops.gdn.chunk_triton")
    stub.chunk_fwd_triton = None
    stub.chunk_decode_triton = lambda q, *a, dots: seen.append(dots) or q.new_zeros(q.shape[0], q.shape[1], 4)
    monkeypatch.setitem(sys.modules, "zeromismatch.ops.gdn.chunk_triton", stub)
    monkeypatch.setattr(aligned_chunk, "on_gpu", lambda x: True)
    heads = GDNHeads(1, 2, 4, 4)

    class View:
        def gdn_slots(self, layer_idx):
            return {}, torch.tensor([0, 1])

    lay = SeqLayout.build([0, 1, 2], torch.tensor([5, 70]))
    for dots in ("ieee", "tf32"):
        gdn = get_numerics({"name": "bi_chunk", "chunk_dots": dots}).gdn
        gdn(torch.randn(2, heads.conv_dim), -torch.rand(2, 2), torch.rand(2, 2), heads, lay, View(), 0)
    assert seen == ["ieee", "tf32"]
