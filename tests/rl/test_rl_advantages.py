import pytest
import torch

from zeromismatch.rl.advantages import (
    broadcast_to_tokens,
    compute_group_advantages,
    group_advantages,
    has_zero_spread,
)


def test_mean_centered_without_std():
    # rewards 1, 0, 0, 1 -> mean 0.5 -> +-0.5
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.equal(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_std_normalized_uses_bessel_and_eps():
    # rewards 1, 0, 0, 0: mean 0.25; unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25 -> std 0.5
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), normalize_std=True, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # eps is added to the std: 0.75 / (0.5 + 0.25) = 1.0
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), normalize_std=True, eps=0.25)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0]), normalize_std=True)


def test_zero_spread_is_tested_on_rewards_not_advantages():
    # fp32 mean of six 0.01s is not exactly 0.01: "all advantages == 0" would miss this group
    r = torch.full((6,), 0.01)
    assert (r - r.mean()).abs().max() > 0
    assert has_zero_spread(r)
    assert not has_zero_spread(torch.tensor([0.1, 0.1, 0.2]))
    assert has_zero_spread(torch.tensor([1.0]))


def test_filter_drops_all_correct_and_all_wrong(make_group):
    groups = [
        make_group("mixed", (1.0, 0.0, 0.0, 0.0)),
        make_group("all_correct", (1.0, 1.0, 1.0, 1.0)),
        make_group("all_wrong", (0.0, 0.0, 0.0, 0.0)),
        make_group("mixed2", (0.0, 1.0, 1.0, 1.0)),
        make_group("all_wrong2", (0.0, 0.0, 0.0, 0.0)),
    ]
    kept, advs, counts = compute_group_advantages(groups)
    assert [g.prompt_id for g in kept] == ["mixed", "mixed2"]
    assert torch.equal(advs[0], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert torch.equal(advs[1], torch.tensor([-0.75, 0.25, 0.25, 0.25]))
    assert (counts.total, counts.kept, counts.dropped) == (5, 2, 3)
    assert (counts.all_correct, counts.all_wrong) == (1, 2)
    d = counts.as_dict()
    assert d["advantages/groups_dropped"] == 3.0 and d["advantages/groups_all_wrong"] == 2.0

    kept, advs, counts = compute_group_advantages(groups, drop_zero_spread=False, normalize_std=True)
    assert len(kept) == 5 and counts.dropped == 0 and counts.all_wrong == 2
    assert torch.equal(advs[1], torch.zeros(4))  # zero spread, std 0 + eps: exactly 0, no NaN


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(torch.tensor([0.5, -1.0]), [3, 2])
    assert torch.equal(out, torch.tensor([0.5, 0.5, 0.5, -1.0, -1.0]))
    with pytest.raises(ValueError):
        broadcast_to_tokens(torch.tensor([0.5, -1.0]), [3])
