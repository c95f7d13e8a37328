"""The end-to-end harness: an engine, a recording proxy and `rlgw serve`, an agent loop with the
real `openai` client, and the three token-exactness checks of a stored sample.

- every mask-1 token is an engine output id, in order, for the rid that produced it, and the
  engine was fed exactly the series before it;
- mask-0 tokens are exactly the template's rendering of the non-generated parts;
- the recorded logprobs equal the engine's teacher-forced logprobs of the final series.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
from transformers import AutoConfig, AutoTokenizer

from tests.support import fixture_prompts as fp
from tests.support.procs import engine_server, free_port, rlgw_process
from tests.support.recording_proxy import Recorder, recording_proxy


@dataclass
class Stack:
    """A running engine, recording proxy and gateway."""

    gateway: str
    engine: str
    recorder: Recorder
    tokenizer: Any
    # (engine URL, tokens) -> each token's teacher-forced logprob (the first: None); default SGLang's.
    forced_logprobs: Callable[[str, list[int]], list[float | None]] | None = None


@contextlib.contextmanager
def stack(model: Path, tmp: Path, *gateway_args: str) -> Iterator[Stack]:
    """Engine on `model`, the recording proxy in front of it, and `rlgw serve` in front of that."""
    with engine_server(model) as engine, recording_proxy(engine) as (proxy, recorder):
        port = free_port()
        args = ["serve", "--engine-url", proxy, "--port", str(port), "--data-dir", str(tmp), *gateway_args]
        with rlgw_process(args, "/health", port) as gw:
            yield Stack(gw, engine, recorder, AutoTokenizer.from_pretrained(model))


def open_session(st: Stack, **body: Any) -> dict[str, Any]:
    """A capture session whose agent (the test) sets the sampling: greedy runs stay deterministic."""
    r = httpx.post(
        st.gateway + "/v1/sessions", json={"task_id": "t", "sampling_precedence": "request", **body}
    )
    r.raise_for_status()
    return r.json()


def finish(st: Stack, sid: str, reward: float = 1.0) -> dict[str, Any]:
    r = httpx.post(st.gateway + f"/v1/sessions/{sid}/finish", json={"reward": reward})
    r.raise_for_status()
    return r.json()


def stored(st: Stack, cursor: int) -> dict[str, Any]:
    r = httpx.get(st.gateway + f"/v1/trajectories/{cursor}")
    r.raise_for_status()
    return r.json()


@dataclass
class Run:
    """What the agent sent each turn, and what came back."""

    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    replies: list[Any] = field(default_factory=list)


def echo(message: Any, *, reserialize: bool, drop_reasoning: bool) -> dict[str, Any]:
    """The assistant message as a careless agent sends it back."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning and not drop_reasoning:
        out["reasoning_content"] = reasoning
    if message.tool_calls:
        calls = []
        for c in message.tool_calls:
            args = c.function.arguments
            if reserialize and (parsed := _json_or_none(args)) is not None:
                # pretty-printed, keys reordered: not the bytes the model emitted (a call cut inside
                # its arguments does not parse: it goes back as it came)
                args = json.dumps(parsed, indent=2, sort_keys=True)
            calls.append(
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}
            )
        out["tool_calls"] = calls
    return out


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def tool_result(call: Any) -> str:
    """What the fixture's tools answer; a call whose arguments do not parse gets the error agents send."""
    args = _json_or_none(call.function.arguments)
    if not isinstance(args, dict):
        return "error: the arguments are not a JSON object"
    if call.function.name == "get_weather":
        return fp.weather_result(args.get("city", "?"), "sunny", 20)
    return json.dumps({"files": ["a.txt", "b.txt"]})


def run_agent(
    st: Stack,
    session: dict[str, Any],
    messages: list[dict[str, Any]],
    *,
    followups: list[str],
    tools: list[dict[str, Any]] | None = fp.TOOLS,
    stream: bool = False,
    max_turns: int = 8,
    reserialize: bool = True,
    drop_reasoning: bool = True,
    **create: Any,
) -> Run:
    """A tool loop with the real openai client: call tools, answer with results, ask follow-ups."""
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    messages = list(messages)
    followups = list(followups)
    run = Run()
    create = {"temperature": 0.0, **create}
    for _ in range(max_turns):
        run.requests.append(list(messages))
        kwargs = {"tools": tools} if tools else {}
        if stream:
            msg = collect_stream(
                client.chat.completions.create(model="m", messages=messages, stream=True, **kwargs, **create)
            )
        else:
            msg = (
                client.chat.completions.create(model="m", messages=messages, **kwargs, **create)
                .choices[0]
                .message
            )
        run.replies.append(msg)
        messages.append(echo(msg, reserialize=reserialize, drop_reasoning=drop_reasoning))
        if msg.tool_calls:
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id, "content": tool_result(c)})
        elif followups:
            messages.append({"role": "user", "content": followups.pop(0)})
        else:
            break
    return run


@dataclass
class StreamedMessage:
    content: str | None
    reasoning_content: str | None
    tool_calls: list[Any]


@dataclass
class _Fn:
    name: str
    arguments: str


@dataclass
class _Call:
    id: str
    function: _Fn


def collect_stream(chunks: Any) -> StreamedMessage:
    """Assemble a streamed reply the way OpenAI clients do."""
    content, reasoning, calls = "", "", {}
    for chunk in chunks:
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, _Call(tc.id or "", _Fn("", "")))
                if tc.id:
                    entry.id = tc.id
                if tc.function and tc.function.name:
                    entry.function.name = tc.function.name
                if tc.function and tc.function.arguments:
                    entry.function.arguments += tc.function.arguments
    return StreamedMessage(content, reasoning or None, [calls[i] for i in sorted(calls)])


def mask_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for i, v in enumerate([*mask.tolist(), 0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i))
            start = None
    return runs


def expected_increment(
    tok: Any, history: list[dict], new: list[dict], tools: Any, kw: dict, *, closed: bool = True
) -> str:
    """The template's text for `new` after the assistant turn ending `history` (full renders).

    `closed`: the reply's sampled ids end with the end-of-turn token `<|im_end|>`. A reply that does
    not (cut at `max_tokens`, by a stop string or another EOS) is closed by the template's
    `<|im_end|>` in the increment (mask 0), as a full render has it.
    """
    t = {"tools": tools} if tools else {}
    full = tok.apply_chat_template(history + new, add_generation_prompt=True, tokenize=False, **t, **kw)
    bare = tok.apply_chat_template(history + new, add_generation_prompt=False, tokenize=False, **t, **kw)
    i = bare.rfind("<|im_start|>assistant")
    j = bare.index("<|im_end|>", i) + (len("<|im_end|>") if closed else 0)
    return full[j:]


def check_engine_spans(st: Stack, doc: dict) -> list[tuple[int, int]]:
    """Mask 1 is exactly the engine's output ids and logprobs for each rid, in order, each fed the series
    before it; returns the sampled spans as [start, end) positions in `tokens`."""
    tokens = np.asarray(doc["tokens"])
    p = len(tokens) - doc["response_length"]
    logprobs = np.asarray(doc["rollout_log_probs"])
    rids = doc["metadata"]["engine_rids"]
    runs = [(p + a, p + b) for a, b in mask_runs(np.asarray(doc["loss_mask"]))]
    assert len(runs) == len(rids), (len(runs), rids)
    for (a, b), rid in zip(runs, rids, strict=True):
        ex = st.recorder.by_rid[rid]
        assert tokens[a:b].tolist() == ex.output_ids
        np.testing.assert_allclose(logprobs[a - p : b - p], ex.logprobs, atol=1e-6)
        # ...and the engine was fed exactly the series up to this turn.
        assert ex.input_ids == tokens[:a].tolist()
    return runs


def check_forced_logprobs(st: Stack, doc: dict, runs: list[tuple[int, int]]) -> None:
    """The recorded logprobs equal the engine's teacher-forced logprobs of the final series, read in
    the sample's semantics (`metadata.engine`): teacher-forced logprobs are the raw model's on every
    engine, so a turn sampled at T != 1 whose logprobs the engine scaled is compared with
    log_softmax(raw / T) over the engine's whole distribution at each position."""
    tokens = doc["tokens"]
    p = len(tokens) - doc["response_length"]
    logprobs = np.asarray(doc["rollout_log_probs"])
    temps = scaled_temperatures(doc["metadata"], len(runs))
    if all(t == 1.0 for t in temps):
        forced = (st.forced_logprobs or sglang_forced_logprobs)(st.engine, list(tokens))
        for a, b in runs:
            np.testing.assert_allclose(logprobs[a - p : b - p], forced[a:b], atol=1e-4)
        return
    vocab = AutoConfig.from_pretrained(st.tokenizer.name_or_path).vocab_size
    rows = sglang_forced_distributions(st.engine, list(tokens), runs[0][0] - 1, vocab)
    for (a, b), t in zip(runs, temps, strict=True):
        for pos in range(a, b):
            raw = rows[pos - runs[0][0]]
            scaled = raw / t - np.logaddexp.reduce(raw / t)
            np.testing.assert_allclose(logprobs[pos - p], scaled[tokens[pos]], atol=1e-4)


def scaled_temperatures(metadata: dict, turns: int) -> list[float]:
    """What each sampled turn's recorded logprobs are scaled by: its temperature where the engine
    says it scales them (`scaled`), 1 for greedy turns and raw logprobs."""
    engine = metadata.get("engine") or {}
    recorded = [t["temperature"] for t in metadata.get("turn_temperature") or []]
    if engine.get("logprobs") != "scaled" or not recorded:
        return [1.0] * turns
    assert len(recorded) == turns, (recorded, turns)
    return [1.0 if t < engine["greedy_below"] else float(t) for t in recorded]


def sglang_forced_logprobs(engine: str, tokens: list[int]) -> list[float | None]:
    """Each token's logprob given the tokens before it, from SGLang's `/generate` (the first: None)."""
    r = httpx.post(
        engine + "/generate",
        json={
            "input_ids": tokens,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout=600,  # long CLI prompts (tests/scaffolds/test_real_clis.py) on a loaded machine
    )
    r.raise_for_status()
    return [e[0] for e in r.json()["meta_info"]["input_token_logprobs"]]


def sglang_forced_distributions(engine: str, tokens: list[int], start: int, vocab: int) -> list[np.ndarray]:
    """The raw logprob of every id (a [vocab] array) at each position from `start` + 1 on, given
    the tokens before it, from SGLang's `/generate` (`logprob_start_len`, every id's top logprob)."""
    r = httpx.post(
        engine + "/generate",
        json={
            "input_ids": tokens,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": vocab,
        },
        timeout=600,
    )
    r.raise_for_status()
    out = []
    for row in r.json()["meta_info"]["input_top_logprobs"][1:]:
        dist = np.full(vocab, -np.inf)
        for lp, tid, *_ in row:
            dist[tid] = lp
        out.append(dist)
    return out


def check_sample(st: Stack, doc: dict, run: Run, tools: Any, kw: dict) -> None:
    """The three token-exactness properties of a stored sample."""
    tok = st.tokenizer
    tokens = np.asarray(doc["tokens"])
    p = len(tokens) - doc["response_length"]
    runs = check_engine_spans(st, doc)
    assert len(runs) == len(run.replies)

    # Mask 0: the prompt, then each increment, as the template renders them.
    t = {"tools": tools} if tools else {}
    prompt = tok.apply_chat_template(run.requests[0], add_generation_prompt=True, tokenize=False, **t, **kw)
    assert tok.decode(tokens[:p].tolist()) == prompt
    assert tokens[:p].tolist() == tok.encode(prompt, add_special_tokens=False)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    for k in range(1, len(runs)):
        history = [*run.requests[k - 1], echo(run.replies[k - 1], reserialize=False, drop_reasoning=False)]
        new = run.requests[k][len(history) :]
        closed = bool(tokens[runs[k - 1][1] - 1] == end_of_turn)
        text = expected_increment(tok, history, new, tools, kw, closed=closed)
        span = tokens[runs[k - 1][1] : runs[k][0]].tolist()
        assert tok.decode(span) == text
        assert span == tok.encode(text, add_special_tokens=False)
    check_forced_logprobs(st, doc, runs)
