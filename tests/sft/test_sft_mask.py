"""SFT trains only on the tokens a task's loss mask marks: a multi-turn demonstration's tool output is context,
never a target."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.sft import SFTBatches


def _encode(record):
    # prompt [10, 11], model turn [20, 21], tool output [30, 31, 32], model turn [40]
    return [10, 11, 20, 21, 30, 31, 32, 40], [0, 0, 1, 1, 0, 0, 0, 1]


def test_targets_are_the_masked_in_tokens_only():
    batches = SFTBatches([{"prompt": "q", "response": "r"}] * 2, _encode, batch_size=2, max_seq_len=64, seed=0)
    ids, cu, rows, targets, n = batches.next_batch()
    assert cu == [0, 8, 16]
    assert n == 6
    assert targets.tolist() == [20, 21, 40, 20, 21, 40]
    # the row predicting token j is j - 1: tool tokens 30..32 are never predicted, but are read as context
    assert rows.tolist() == [1, 2, 6, 9, 10, 14]
    assert torch.equal(ids[rows + 1], targets)
    assert not set(targets.tolist()) & {10, 11, 30, 31, 32}


def test_single_turn_mask_is_prompt_then_target():
    """The math layout (prompt, then solution + eos): rows from the last prompt token to the one before eos."""
    enc = lambda r: ([1, 2, 3, 7, 8, 9], [0, 0, 0, 1, 1, 1])  # noqa: E731
    _, _, rows, targets, n = SFTBatches([{}], enc, 1, 64, 0).next_batch()
    assert rows.tolist() == [2, 3, 4] and targets.tolist() == [7, 8, 9] and n == 3


@pytest.mark.parametrize("mask", [[0, 0, 0], [1, 1, 1], [0, 1]])
def test_bad_masks_are_refused(mask):
    enc = lambda r: ([1, 2, 3], mask)  # noqa: E731
    with pytest.raises(ValueError, match="loss mask"):
        SFTBatches([{}], enc, 1, 64, 0).next_batch()
