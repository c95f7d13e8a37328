"""The wide-head copies of the tiny fixtures compute what the originals compute (`wide_heads.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.wide_heads import widen_heads


@pytest.mark.parametrize(("name", "untie"), [("tiny-qwen3", True), ("tiny-chatml", False)])
def test_wider_heads_give_the_same_logits(
    name: str, untie: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    src = request.getfixturevalue(name.replace("-", "_"))
    wide = widen_heads(src, tmp_path / name, untie=untie)
    config = AutoModelForCausalLM.from_pretrained(wide).config
    assert config.head_dim == 64 and config.tie_word_embeddings is not untie
    ids = torch.randint(0, 4000, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(wide, dtype=torch.float32).eval()(ids).logits
    # Exact but for the RMSNorm epsilon, which now sits beside a mean over 4x as many dims.
    torch.testing.assert_close(b, a, atol=2e-4, rtol=0)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_only_multiples_of_the_head_size_widen(tiny_qwen3: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        widen_heads(tiny_qwen3, tmp_path / "x", head_dim=40)
