"""Added latency per turn of the Messages and Responses surfaces beside Chat Completions.

The set-up of bench/gateway.py (stub engine answering at once, real Qwen3 tokenizer and
template, a long first user message, then every turn the model's tool call echoed back and a
~200-token observation), at one history size (8k tokens by default). Three sessions run side by
side, one per surface, their turns interleaved so that machine noise falls on all three alike:
Chat Completions (`messages` + `tool` results), Anthropic Messages (`content` blocks echoed,
`tool_result` blocks) and OpenAI Responses (output items echoed, `function_call_output`
items; the whole input resent, as Chat Completions does). Per turn, the added latency is the
request through the gateway minus a direct `/generate` of the same length just before it.
Goal (issue 12): each surface's added p50 within 0.5 ms of the Chat Completions figure.

    python bench/surfaces.py [--sessions 25] [--turns 3] [--history 8000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gateway import JSON, filler, load_average, pct, qwen3_tokenizer_dir
from tests.support.procs import free_port, rlgw_process, wait_healthy

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}


@dataclass
class Surface:
    """One API surface's request shape and its way of carrying the conversation on."""

    name: str
    path: str
    user: str
    observation: str
    history: list[Any] = field(default_factory=list)
    last_body: bytes = b""
    last_reply: dict[str, Any] = field(default_factory=dict)
    added: list[float] = field(default_factory=list)
    through: list[float] = field(default_factory=list)

    def start(self) -> None:
        """A new conversation: the long user message (the same item shape on every surface)."""
        self.history = [{"role": "user", "content": self.user}]

    def body(self) -> bytes:
        if self.name == "chat":
            doc = {
                "model": "stub",
                "messages": self.history,
                "tools": [{"type": "function", "function": BASH}],
            }
        elif self.name == "messages":
            tool = {
                "name": BASH["name"],
                "description": BASH["description"],
                "input_schema": BASH["parameters"],
            }
            doc = {"model": "stub", "max_tokens": 1024, "messages": self.history, "tools": [tool]}
        else:
            doc = {"model": "stub", "input": self.history, "tools": [{"type": "function", **BASH}]}
        self.last_body = orjson.dumps({**doc, "temperature": 0})
        return self.last_body

    def carry_on(self, reply: dict[str, Any]) -> int:
        """Append the reply and the tool results; the prompt length the gateway reported."""
        self.last_reply = reply
        if self.name == "chat":
            msg = reply["choices"][0]["message"]
            self.history.append(msg)
            for call in msg.get("tool_calls") or []:
                self.history.append({"role": "tool", "tool_call_id": call["id"], "content": self.observation})
            return reply["usage"]["prompt_tokens"]
        if self.name == "messages":
            self.history.append({"role": "assistant", "content": reply["content"]})
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": self.observation}
                for b in reply["content"]
                if b["type"] == "tool_use"
            ]
            self.history.append({"role": "user", "content": results})
            u = reply["usage"]
            return u["input_tokens"] + u["cache_read_input_tokens"]
        self.history += reply["output"]
        self.history += [
            {"type": "function_call_output", "call_id": i["call_id"], "output": self.observation}
            for i in reply["output"]
            if i["type"] == "function_call"
        ]
        return reply["usage"]["input_tokens"]


async def measure(gw: str, stub_url: str, surfaces: list[Surface], args: argparse.Namespace) -> None:
    """Interleaved turns of one session per surface; fills each surface's `added` and `through`."""
    async with aiohttp.ClientSession() as client:
        for i in range(args.sessions):
            sessions = []
            for surface in surfaces:
                async with client.post(gw + "/v1/sessions", json={"task_id": "bench"}) as r:
                    sessions.append(await r.json())
                surface.start()
            prompt_len = [0] * len(surfaces)
            for turn in range(args.turns + 1):
                # Each surface takes each place in the order equally often (the first request
                # after a pause is slower on a busy machine).
                shift = i + turn
                order = [(k + shift) % len(surfaces) for k in range(len(surfaces))]
                for k in order:
                    surface, s = surfaces[k], sessions[k]
                    headers = {"Authorization": f"Bearer {s['api_key']}", **JSON}
                    body = surface.body()
                    if turn > 0:
                        ids = np.full(prompt_len[k], 11, dtype=np.int32)
                        payload = orjson.dumps(
                            {"input_ids": ids, "return_logprob": True}, option=orjson.OPT_SERIALIZE_NUMPY
                        )
                        t0 = time.perf_counter()
                        async with client.post(stub_url + "/generate", data=payload, headers=JSON) as r:
                            await r.read()
                        direct = time.perf_counter() - t0
                    t2 = time.perf_counter()
                    async with client.post(s["base_url"] + surface.path, data=body, headers=headers) as r:
                        raw = await r.read()
                        r.raise_for_status()
                    through = time.perf_counter() - t2
                    if turn > 0:
                        surface.through.append(through)
                        surface.added.append(through - direct)
                    prompt_len[k] = surface.carry_on(orjson.loads(raw))
            for s in sessions:
                async with client.post(
                    gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 0.0}
                ) as r:
                    await r.read()


def reply_turn(completion: dict[str, Any]) -> Any:
    """The finished turn (`turns.messages.ChatTurn`) a ChatCompletion was built from."""
    from rlgw.gateway.engine_client.backend import GenerationResult
    from rlgw.gateway.parsing.output_parser import ParsedOutput, ToolCall
    from rlgw.gateway.turns.messages import ChatTurn

    msg, usage = completion["choices"][0]["message"], completion["usage"]
    calls = msg.get("tool_calls") or []
    parsed = ParsedOutput(
        msg.get("content") or "",
        msg.get("reasoning_content"),
        [ToolCall(i, c["function"]["name"], c["function"]["arguments"]) for i, c in enumerate(calls)],
        [],
    )
    n, prompt = usage["completion_tokens"], usage["prompt_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    result = GenerationResult("r", [0] * n, [0.0] * n, {"type": "stop"}, "0", prompt, cached)
    ids = [c["id"] for c in calls]
    return ChatTurn(completion["id"], completion["created"], parsed, ids, result, prompt, None, 0)


def translation_cost(surfaces: list[Surface], number: int = 200) -> dict[str, float]:
    """In-process microseconds per turn of what differs between surfaces: request validation
    and translation into the turn's parameters, and the finished turn's translation into the
    surface's reply (the turn itself is shared, so it is left out)."""
    from rlgw.gateway.surfaces.anthropic import api as anthropic_api
    from rlgw.gateway.surfaces.anthropic import translate as at
    from rlgw.gateway.surfaces.openai_chat import ChatCompletionRequest, chat_params, completion_doc
    from rlgw.gateway.surfaces.responses import translate as rt

    chat, messages, responses = surfaces
    model = chat.last_reply["model"]
    turn = reply_turn(chat.last_reply)
    profile = SimpleNamespace(name=model)  # all the ChatCompletion takes of the profile

    def chat_turn() -> None:
        chat_params(ChatCompletionRequest.model_validate(orjson.loads(chat.last_body)))
        completion_doc(profile, turn)  # type: ignore[arg-type]

    def messages_turn() -> None:
        anthropic_api.turn_params(at.MessagesRequest.model_validate(orjson.loads(messages.last_body)))
        at.message(turn, model)

    def responses_turn() -> None:
        req = rt.ResponsesRequest.model_validate(orjson.loads(responses.last_body))
        rt.turn_params(req, rt.input_items(req.input))
        rt.response(req, turn, model)

    out = {}
    for name, fn in (("chat", chat_turn), ("messages", messages_turn), ("responses", responses_turn)):
        out[name] = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=25)
    ap.add_argument("--turns", type=int, default=3, help="measured turns per session (after the first)")
    ap.add_argument("--history", type=int, default=8000, help="tokens in the first user message")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    user, observation = filler(tok, args.history, seed=0), filler(tok, 200, seed=1)
    stub_port = free_port()
    stub = subprocess.Popen(
        [sys.executable, "-m", "bench.stub_engine", "--tokenizer", tok_dir, "--port", str(stub_port)],
        cwd=Path(__file__).resolve().parents[1],
    )
    stub_url = f"http://127.0.0.1:{stub_port}"
    try:
        wait_healthy(stub_url + "/health", stub)
        port = free_port()
        serve = ["--log-level", "warning", "serve", "--engine-url", stub_url, "--port", str(port)]
        with (
            tempfile.TemporaryDirectory() as data,
            rlgw_process([*serve, "--data-dir", data], "/health", port) as gw,
        ):
            surfaces = [
                Surface("chat", "/chat/completions", user, observation),
                Surface("messages", "/messages", user, observation),
                Surface("responses", "/responses", user, observation),
            ]
            asyncio.run(measure(gw, stub_url, surfaces, args))
            print(f"gateway {gw} -> stub engine {stub_url}; history ~{args.history} tokens; {load_average()}")
            print(
                "{:>10} {:>10} {:>10} {:>10} {:>12} {:>4}".format(
                    "surface", "rlgw p50", "added p50", "added p99", "vs chat p50", "n"
                )
            )
            chat = statistics.median(surfaces[0].added) * 1e3
            diffs = {}
            for s in surfaces:
                a50 = statistics.median(s.added) * 1e3
                diffs[s.name] = a50 - chat
                print(
                    f"{s.name:>10} {statistics.median(s.through) * 1e3:>8.2f}ms {a50:>8.2f}ms"
                    f" {pct(s.added, 0.99) * 1e3:>8.2f}ms {diffs[s.name]:>+10.2f}ms {len(s.added):>4}"
                )
            worst = max(abs(diffs["messages"]), abs(diffs["responses"]))
            print(
                f"goal: Messages, Responses added p50 within 0.5 ms of Chat Completions: worst {worst:.2f} ms"
            )
            cost = translation_cost(surfaces)
            print(
                "in-process, per turn (validate + translate the request, translate the reply): "
                + ", ".join(f"{k} {v:.0f} us ({v - cost['chat']:+.0f} us vs chat)" for k, v in cost.items())
            )
    finally:
        stub.terminate()
        stub.wait()


if __name__ == "__main__":
    main()
