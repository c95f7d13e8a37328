"""The teacher client: a frozen model behind SGLang's `/generate`, in its own template and tool format.

Two roles:
- A, label a turn: render the conversation in the teacher's chat template (its own tokenizer, on
  CPU), generate, and parse the reply with the teacher's tool-call and reasoning formats into a
  `CanonicalAction`. Any failure returns None: the student's trajectory is never touched.
- B, force-decode a kept trajectory: one `/generate` over prompt + response ids with
  `max_new_tokens: 1` and `logprob_start_len = prompt_len - 1` returns the teacher's logprob of
  every student token and its top-K (the inputs of the K3 loss). This needs the teacher to share
  the student's vocabulary: a mismatch is refused. Transport failures are retried; a persistent
  failure raises `TeacherUnavailable` (loud, never empty logprobs).

Transport is the engine client's (`rlgw.gateway.engine_client.transport`: one pooled connection set, shared by
role A's `SGLangBackend` and role B's force-decodes); this module owns the teacher's payloads and
the reading of teacher-forced logprobs. It knows nothing about training.

Errors::

    TeacherError            anything role B raises
    ├── VocabMismatch       teacher and student tokenizers differ: force-decoding would score other tokens
    └── TeacherUnavailable  the teacher failed on every attempt
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from rlgw.gateway.content import content_text
from rlgw.gateway.engine_client.backend import GenerationResult, SGLangBackend
from rlgw.gateway.engine_client.transport import AiohttpTransport, Transport, TransportError
from rlgw.gateway.model.profile import build_profile
from rlgw.gateway.parsing.output_parser import OutputParser
from rlgw.gateway.sample import Sample

log = logging.getLogger(__name__)


class TeacherError(Exception):
    """Base of the teacher's role-B errors."""


class VocabMismatch(TeacherError):
    """The teacher's vocabulary is not the student's, so it cannot score the student's token ids."""


class TeacherUnavailable(TeacherError):
    """The teacher did not answer usefully after every retry."""


@dataclass(frozen=True, slots=True)
class CanonicalAction:
    """A teacher's reply, independent of its template: text, reasoning, and tool calls (parsed arguments)."""

    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": str, "arguments": dict}


@dataclass(frozen=True, slots=True)
class TeacherScores:
    """The teacher's view of a response: logprob of each student token, and the top-K at each position."""

    log_probs: np.ndarray  # float32 [n]
    topk_indices: np.ndarray  # int32 [n, k]
    topk_logprobs: np.ndarray  # float32 [n, k]


def force_decode_payload(prompt_ids: list[int], response_ids: list[int], k: int) -> dict[str, Any]:
    """The `/generate` body that scores `response_ids` after `prompt_ids` (one greedy step, logprobs on)."""
    return {
        "input_ids": [*prompt_ids, *response_ids],
        "sampling_params": {
            "max_new_tokens": 1,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": -1,
            "no_stop_trim": True,
        },
        "return_logprob": True,
        "logprob_start_len": len(prompt_ids) - 1,
        "top_logprobs_num": k,
    }


def read_scores(doc: dict[str, Any], response_ids: list[int], k: int) -> TeacherScores:
    """Teacher-forced logprobs of the response from a `/generate` reply; checks the alignment."""
    meta = doc.get("meta_info") or {}
    # Entry 0 is the last prompt token (logprob null); entries 1.. are the response tokens.
    triples = (meta.get("input_token_logprobs") or [])[1:]
    rows = (meta.get("input_top_logprobs") or [])[1:]
    n = len(response_ids)
    if len(triples) != n or (k and len(rows) != n):
        raise TeacherError(
            f"teacher returned {len(triples)} logprobs and {len(rows)} top-k rows for {n} tokens"
        )
    ids = [int(t[1]) for t in triples]
    if ids != list(response_ids):
        raise TeacherError("teacher-forced logprobs are not aligned to the student's tokens")
    lps = np.array([float(t[0]) for t in triples], dtype=np.float32)
    top_ids = np.zeros((n, k), np.int32)
    top_lps = np.zeros((n, k), np.float32)
    for i, row in enumerate(rows if k else []):
        if row is None or len(row) < k:
            raise TeacherError(f"teacher returned a short top-k row at response position {i}")
        top_lps[i] = [float(e[0]) for e in row[:k]]
        top_ids[i] = [int(e[1]) for e in row[:k]]
    if not np.all(np.isfinite(lps)):
        raise TeacherError("teacher returned non-finite logprobs")
    return TeacherScores(lps, top_ids, top_lps)


class TeacherBackend:
    """A frozen teacher model served over SGLang's protocol; see the module docstring for its two roles.

    `student_tokenizer` enables role B (force-decoding) after checking that both vocabularies are
    the same token-for-token. `retries` and `backoff` apply to role B's transport failures and 5xx.
    """

    def __init__(
        self,
        url: str,
        tokenizer: Any,
        *,
        tool_format: str | None,
        reasoning: bool,
        student_tokenizer: Any | None = None,
        transport: Transport | None = None,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        self.url = url.rstrip("/")
        self.transport = transport or AiohttpTransport(self.url)
        self.backend = SGLangBackend(self.url, transport=self.transport)
        self.tokenizer = tokenizer
        self.tool_format, self.reasoning = tool_format, reasoning
        self.retries, self.backoff = retries, backoff
        self.vocab_problem: str | None = "no student tokenizer was given"
        if student_tokenizer is not None:
            self.vocab_problem = vocab_difference(tokenizer, student_tokenizer)

    @classmethod
    async def connect(
        cls, url: str, *, student_tokenizer: Any | None = None, tokenizer: str | None = None, **kwargs: Any
    ) -> TeacherBackend:
        """Ask the teacher engine what it serves, load its tokenizer and template, decide its parsers."""
        transport = kwargs.pop("transport", None) or AiohttpTransport(url.rstrip("/"))
        info = await SGLangBackend(url, transport=transport).model_info()
        profile = await asyncio.to_thread(build_profile, info, tokenizer=tokenizer)
        return cls(url, profile.tokenizer, tool_format=profile.tool_format, reasoning=profile.reasoning,
                   student_tokenizer=student_tokenizer, transport=transport, **kwargs)  # fmt: skip

    async def aclose(self) -> None:
        """Close the transport."""
        await self.backend.aclose()

    # Role A ------------------------------------------------------------------------------------

    async def label_turn(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        max_tokens: int = 512,
    ) -> CanonicalAction | None:
        """The teacher's next action for this conversation, or None if anything fails."""
        try:
            ids = self.tokenizer.apply_chat_template(
                [_normalized(m) for m in messages],
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=True,
            )
            if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
                ids = list(ids["input_ids"])
            result = await self.generate_from_tokens(ids, max_tokens=max_tokens)
            if result is None:
                return None
            return self._parse(ids, result, tools)
        except Exception as exc:
            log.warning("teacher label failed", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
            return None

    async def generate_from_tokens(
        self, input_ids: list[int], *, max_tokens: int = 512
    ) -> GenerationResult | None:
        """Greedy generation from a pre-built token sequence; None on failure."""
        try:
            return await self.backend.generate(
                input_ids,
                {"max_new_tokens": max_tokens, "temperature": 0.0},
                rid=_rid(),
                routing_key="teacher",
            )
        except Exception as exc:
            log.warning(
                "teacher generate failed", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}}
            )
            return None

    def _parse(
        self, prompt_ids: list[int], result: GenerationResult, tools: list[dict] | None
    ) -> CanonicalAction:
        think = self.tokenizer.encode("<think>\n", add_special_tokens=False) if self.reasoning else []
        forced = bool(think) and prompt_ids[-len(think) :] == think
        parser = OutputParser(
            tool_format=self.tool_format, tools=tools, reasoning=self.reasoning, reasoning_forced=forced
        )
        parser.feed(self.tokenizer.decode(result.output_ids, skip_special_tokens=True))
        parser.close()
        out = parser.result()
        calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in out.tool_calls]
        return CanonicalAction(content=out.content.strip(), reasoning=out.reasoning_content, tool_calls=calls)

    # Role B ------------------------------------------------------------------------------------

    async def force_decode(
        self, prompt_ids: list[int], response_ids: list[int], k: int = 20
    ) -> TeacherScores:
        """The teacher's logprob of each response token and its top-`k`; raises `TeacherError` subclasses."""
        if self.vocab_problem is not None:
            raise VocabMismatch(f"force-decoding needs the student's vocabulary: {self.vocab_problem}")
        if not prompt_ids or not response_ids:
            raise TeacherError("force-decoding needs a non-empty prompt and response")
        body = orjson.dumps(force_decode_payload(list(prompt_ids), list(response_ids), k))
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                reply = await self.transport.request(
                    "POST", "/generate", body, {"Content-Type": "application/json"}
                )
                try:
                    content, status = await reply.read(), reply.status
                finally:
                    await reply.close()
            except TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if status >= 500:
                last = f"HTTP {status}: {content[:300].decode(errors='replace')}"
                continue
            if status != 200:  # the request itself is wrong: retrying cannot help
                raise TeacherError(
                    f"teacher refused the force-decode: HTTP {status}: "
                    f"{content[:500].decode(errors='replace')}"
                )
            doc = orjson.loads(content)
            return read_scores(doc[0] if isinstance(doc, list) else doc, list(response_ids), k)
        raise TeacherUnavailable(f"teacher at {self.url} failed {self.retries + 1} times; last: {last}")

    async def capture(self, sample: Sample, k: int = 20) -> Sample:
        """A copy of `sample` with the teacher fields set (one force-decode of its prompt + response)."""
        tokens = sample.tokens.tolist()
        cut = sample.prompt_length
        scores = await self.force_decode(tokens[:cut], tokens[cut:], k)
        return dataclasses.replace(
            sample,
            teacher_log_probs=scores.log_probs,
            teacher_topk_indices=scores.topk_indices,
            teacher_topk_logprobs=scores.topk_logprobs,
        )


def vocab_difference(teacher: Any, student: Any) -> str | None:
    """None when both tokenizers map the same strings to the same ids, else what differs."""
    t, s = teacher.get_vocab(), student.get_vocab()
    if t == s:
        return None
    differing = sum(1 for tok, i in s.items() if t.get(tok) != i)
    return (
        f"teacher vocabulary has {len(t)} tokens, student {len(s)}; "
        f"{differing} student tokens map differently"
    )


def _normalized(message: dict[str, Any]) -> dict[str, Any]:
    """Shapes the Qwen3 template rejects (`content: None`, content as parts) as plain strings."""
    m = dict(message)
    content = m.get("content")
    if content is None:
        m["content"] = ""
    elif isinstance(content, list):
        # Joined as the student's template rendered them (`content.SEPARATOR`): the teacher labels
        # the turn the student saw.
        m["content"] = content_text(content)
    calls = m.get("tool_calls")
    if calls:
        m["tool_calls"] = [_parsed_arguments(c) for c in calls]
    return m


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass
    return {**call, "function": fn}


def _rid() -> str:
    return "teacher-" + uuid.uuid4().hex
