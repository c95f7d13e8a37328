"""The teacher's force-decode (role B: `logprob_start_len` and `top_logprobs_num` on `/generate`) with the
real SGLang as the teacher: each response token's logprob and the top-K rows equal the served checkpoint's
own teacher-forced scoring (transformers, float32), as on the embedded engine (tests/trainer/test_teacher.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgw.gateway.teacher.client import TeacherBackend
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack


def hf_scores(model_dir: Path, ids: list[int], prompt_len: int, k: int) -> tuple[np.ndarray, ...]:
    """Each response token's logprob and the top-k ids and logprobs, by the checkpoint loaded directly."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    rows = logp[prompt_len - 1 : len(ids) - 1]
    chosen = rows.gather(1, torch.tensor(ids[prompt_len:])[:, None])[:, 0]
    top = rows.topk(k)
    return chosen.numpy(), top.indices.numpy(), top.values.numpy()


async def test_sglang_as_teacher_force_decodes_with_top_k(sglang_qwen3: Stack) -> None:
    # What SGLang serves now (a weight-sync test may have loaded another version into it).
    async with httpx.AsyncClient() as http:
        model_dir = Path((await http.get(sglang_qwen3.engine + "/model_info")).json()["model_path"])
    student = AutoTokenizer.from_pretrained(model_dir)
    teacher = await TeacherBackend.connect(sglang_qwen3.engine, student_tokenizer=student)
    try:
        prompt = student.apply_chat_template(
            fp.WEATHER, tools=fp.TOOLS, add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt["input_ids"]) if not isinstance(prompt, list) else prompt
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        response = student.encode(call)
        response += student.encode("<|im_end|>")
        scores = await teacher.force_decode(prompt, response, k=5)
        want, top_ids, top_lps = hf_scores(model_dir, prompt + response, len(prompt), 5)
        assert scores.log_probs.shape == (len(response),) and scores.topk_indices.shape == (len(response), 5)
        np.testing.assert_allclose(scores.log_probs, want, atol=1e-4)
        np.testing.assert_array_equal(scores.topk_indices, top_ids)
        np.testing.assert_allclose(scores.topk_logprobs, top_lps, atol=1e-4)
    finally:
        await teacher.aclose()
