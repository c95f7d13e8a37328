"""`TeacherBackend` on the embedded engine: force-decode equals teacher-forced scoring and top-K; failures."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgw.gateway.engine_client.transport import HandlerTransport
from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.teacher.client import TeacherBackend, TeacherError, TeacherUnavailable, VocabMismatch
from tests.support import fixture_prompts as fp
from tests.support.procs import FIXTURES, engine_server, free_port

QWEN = FIXTURES / "tiny-qwen3"


@pytest.fixture(scope="module")
def engine_url():
    with engine_server(QWEN) as url:
        yield url


@pytest.fixture(scope="module")
def student() -> object:
    return AutoTokenizer.from_pretrained(QWEN)


def reference(ids: list[int], prompt_len: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced scoring by the checkpoint loaded directly: each response token's logprob and top-k."""
    model = AutoModelForCausalLM.from_pretrained(QWEN, dtype=torch.float32)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    rows = logp[prompt_len - 1 : len(ids) - 1]
    chosen = rows.gather(1, torch.tensor(ids[prompt_len:])[:, None])[:, 0]
    top = rows.topk(k)
    return chosen, top.indices, top.values


async def test_force_decode_equals_teacher_forced_scoring_with_top_k(engine_url: str, student) -> None:
    teacher = await TeacherBackend.connect(engine_url, student_tokenizer=student)
    try:
        prompt = student.apply_chat_template(
            fp.WEATHER, tools=fp.TOOLS, add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt["input_ids"]) if not isinstance(prompt, list) else prompt
        response = student.encode(
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        )
        response += [4002]  # <|im_end|>
        scores = await teacher.force_decode(prompt, response, k=5)
        want, top_ids, top_lps = reference(prompt + response, len(prompt), 5)
        assert scores.log_probs.shape == (len(response),) and scores.topk_indices.shape == (len(response), 5)
        np.testing.assert_allclose(scores.log_probs, want.numpy(), atol=1e-4)
        np.testing.assert_array_equal(scores.topk_indices, top_ids.numpy())
        np.testing.assert_allclose(scores.topk_logprobs, top_lps.numpy(), atol=1e-4)
        # the chosen token's logprob is never above the best one; where it is the argmax they agree
        assert np.all(scores.log_probs <= scores.topk_logprobs[:, 0] + 1e-6)

        n = len(response)
        sample = Sample(np.asarray(prompt + response, np.int32), n, np.ones(n, np.uint8),
                        np.full(n, -1.0, np.float32), 1.0, SampleStatus.COMPLETED, "r", 0,
                        [VersionSpan("0", 0, n)])  # fmt: skip
        captured = await teacher.capture(sample, k=3)
        np.testing.assert_array_equal(captured.teacher_log_probs, scores.log_probs)
        np.testing.assert_array_equal(captured.teacher_topk_indices, scores.topk_indices[:, :3])
        assert sample.teacher_log_probs is None  # the student's sample is not touched
    finally:
        await teacher.aclose()


async def test_role_a_labels_a_turn_in_the_teachers_format(engine_url: str) -> None:
    teacher = await TeacherBackend.connect(engine_url)
    try:
        action = await teacher.label_turn(fp.WEATHER, fp.TOOLS, max_tokens=64)
        assert action is not None
        assert [c["name"] for c in action.tool_calls] == ["get_weather"]
        assert action.tool_calls[0]["arguments"] == {"city": "Paris"}
        plain = await teacher.label_turn(fp.PLAIN, max_tokens=64)
        assert plain is not None and plain.tool_calls == []
        assert (
            plain.content.startswith("The capital of France is") and plain.reasoning
        )  # its think block, parsed
        # a conversation the template cannot render: None, no exception
        assert await teacher.label_turn([{"role": "user", "content": 5}], max_tokens=8) is None
    finally:
        await teacher.aclose()


async def test_vocabulary_mismatch_is_refused(engine_url: str) -> None:
    other = AutoTokenizer.from_pretrained(FIXTURES / "tiny-chatml")
    teacher = await TeacherBackend.connect(engine_url, student_tokenizer=other)
    try:
        with pytest.raises(VocabMismatch, match="map differently"):
            await teacher.force_decode([1, 2, 3], [4, 5])
        no_student = await TeacherBackend.connect(engine_url)
        with pytest.raises(VocabMismatch, match="no student tokenizer"):
            await no_student.force_decode([1, 2, 3], [4, 5])
        await no_student.aclose()
    finally:
        await teacher.aclose()


async def test_persistent_failure_is_loud_and_a_bad_request_is_not_retried(engine_url: str, student) -> None:
    dead = TeacherBackend(f"http://127.0.0.1:{free_port()}", student, tool_format=None, reasoning=False,
                          student_tokenizer=student, retries=2, backoff=0.01)  # fmt: skip
    with pytest.raises(TeacherUnavailable, match="failed 3 times"):
        await dead.force_decode([1, 2, 3], [4, 5])
    assert await dead.label_turn(fp.PLAIN) is None  # role A: None, never an exception
    await dead.aclose()

    calls = []

    async def overloaded(method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        calls.append(path)
        return 503, b'{"error": {"message": "overloaded"}}'

    busy = TeacherBackend("http://teacher", student, tool_format=None, reasoning=False,
                          student_tokenizer=student, transport=HandlerTransport(overloaded), retries=2,
                          backoff=0.01)  # fmt: skip
    with pytest.raises(TeacherUnavailable, match="HTTP 503"):
        await busy.force_decode([1, 2, 3], [4, 5])
    assert calls == ["/generate"] * 3

    async def misaligned(method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        doc = {"meta_info": {"input_token_logprobs": [[None, 3, None], [-0.1, 4, None], [-0.2, 9, None]],
                             "input_top_logprobs": [None, [[-0.1, 4, None]], [[-0.2, 9, None]]]}}  # fmt: skip
        return 200, orjson.dumps(doc)

    wrong = TeacherBackend("http://teacher", student, tool_format=None, reasoning=False,
                           student_tokenizer=student, transport=HandlerTransport(misaligned))  # fmt: skip
    with pytest.raises(TeacherError, match="not aligned"):
        await wrong.force_decode([1, 2, 3], [4, 5], k=1)

    real = TeacherBackend(engine_url, student, tool_format=None, reasoning=False, student_tokenizer=student)
    with pytest.raises(TeacherError, match="HTTP 400"):
        await real.force_decode([1, 2, 3], [999_999])  # out of vocabulary: the engine refuses, no retry
    await real.aclose()
