"""A sample built from a real two-turn ledger (Qwen3's template renders the prompt and the tool
result): its prompt is exactly the first rendered prompt, and `prompt_length` says where the
response region starts, through the store's JSON round trip as well. And the rounding tolerance
on a trainable token's logprob, at its boundary."""

from __future__ import annotations

import numpy as np

from rlgw.gateway.ledger.ledger import Ledger, TurnCommit
from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.sample import RejectReason, Sample, validate_sample
from tests.gateway.test_sample_validation import VOCAB, rejected, with_logprob
from tests.support.real_tokenizers import qwen3_tokenizer

USER = {"role": "user", "content": "Weather in Paris?"}
TOOL = {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}


def _turn(new: list[dict], prompt: list[int], out: list[int], rid: str) -> TurnCommit:
    lps = [-0.5] * len(out)
    return TurnCommit(new, prompt, out, lps, [], "chatcmpl-" + rid, (), "", rid, "stop", True, [])


def test_prompt_length_is_the_first_rendered_prompt() -> None:
    tok = qwen3_tokenizer()
    renderer = ChatRenderer(tok)
    eot = tok.convert_tokens_to_ids(renderer.end_of_turn_text)
    prompt = renderer.render_prompt([USER], None)
    first_out = [*tok.encode("Checking.", add_special_tokens=False), eot]
    tool_inc = renderer.render_continuation([TOOL], None, previous_ended_with_eos=True, anchor_user=USER)
    second_out = [*tok.encode("It is sunny.", add_special_tokens=False), eot]

    ledger = Ledger()
    ledger.commit(_turn([USER], prompt, first_out, "r1"), "v1")
    ledger.commit(_turn([TOOL], tool_inc, second_out, "r2"), "v1")
    [(_, sample, _)] = ledger.build_samples(
        reward=1.0, status=None, rollout_id="r", group_index=0, metadata={}
    )
    assert sample is not None
    validate_sample(sample, len(tok))

    assert sample.prompt_length == len(prompt)
    assert sample.tokens[: sample.prompt_length].tolist() == prompt
    assert sample.response_length == len(first_out) + len(tool_inc) + len(second_out)
    assert sample.tokens[sample.prompt_length :].tolist() == first_out + tool_inc + second_out
    assert sample.loss_mask.tolist() == [1] * len(first_out) + [0] * len(tool_inc) + [1] * len(second_out)

    again = Sample.from_dict(sample.to_dict())
    assert again.prompt_length == len(prompt)
    assert np.array_equal(again.tokens, sample.tokens) and np.array_equal(again.loss_mask, sample.loss_mask)


def test_a_positive_logprob_up_to_the_rounding_tolerance_is_accepted() -> None:
    # Engines round: a trainable token's logprob may read up to +1e-4 (float32), inclusive.
    validate_sample(with_logprob(0, 1e-4), VOCAB)
    assert rejected(with_logprob(0, 2e-4)) == RejectReason.BAD_LOGPROB
