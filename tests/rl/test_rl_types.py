import math

import pytest
import torch

from zeromismatch.rl.types import Group, Sample, Turn


def _kwargs(**over):
    kw = dict(
        prompt_ids=[1, 2],
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        gen_logprobs=[math.nan, math.nan, -0.5, -1.0],
        gen_version=[-1, -1, 3, 4],
        reward=1.0,
        turns=[Turn((3, 4), admission_version=3)],
    )
    kw.update(over)
    return kw


def test_sample_converts_lists_to_exact_dtypes():
    s = Sample(**_kwargs())
    assert s.token_ids.dtype == torch.int64 and s.gen_version.dtype == torch.int64
    assert s.gen_logprobs.dtype == torch.float32
    assert s.num_trained_tokens == 2 and s.min_admission_version == 3


def test_sample_refuses_silent_float_casts():
    s = Sample(**_kwargs(loss_mask=torch.tensor([False, False, True, True])))  # lossless: accepted
    assert s.loss_mask.dtype == torch.int64 and s.num_trained_tokens == 2
    with pytest.raises(TypeError):
        Sample(**_kwargs(token_ids=torch.tensor([1.0, 2.0, 3.0, 4.0])))
    with pytest.raises(TypeError):
        Sample(**_kwargs(gen_logprobs=torch.tensor([0.0, 0.0, -0.5, -1.0], dtype=torch.float64)))


@pytest.mark.parametrize(
    "over",
    [
        dict(loss_mask=[0, 0, 1]),  # length mismatch
        dict(prompt_ids=[1, 9]),  # not a prefix
        dict(loss_mask=[0, 1, 1, 1]),  # trains on a prompt token
        dict(loss_mask=[0, 0, 2, 1]),  # not 0/1
        dict(turns=[]),  # no generator call
        dict(turns=[Turn((3,), 3)]),  # 2 trained tokens but only 1 generated
        dict(gen_version=[-1, -1, 2, 4]),  # token older than the first admission
    ],
)
def test_sample_validation(over):
    with pytest.raises(ValueError):
        Sample(**_kwargs(**over))


def test_group_min_admission_version_spans_all_turns_and_samples(make_sample):
    a = make_sample(turn_versions=(5, 7))
    b = make_sample(turn_versions=(4, 9))
    g = Group("p", [a, b])
    assert a.min_admission_version == 5
    assert g.min_admission_version == 4
    assert torch.equal(g.rewards, torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError):
        Group("empty", [])
