"""The end-to-end fidelity assertions over a table of conversations, on both fixtures.

Every scenario is a scripted agent talking to the real gateway in front of the real engine
(through the recording proxy). Each stored sample is checked token for token
(`tests/support/e2e.py`, `check_sample`): mask-1 tokens are the engine's output ids for each rid and the
engine was fed exactly the series before them; mask-0 spans are the template's own full-render
increments; recorded logprobs equal the engine's teacher-forced logprobs. Scenarios that
rewrite history, change tools, switch API or resend a request must produce the segments
(and causes) the rules say, each segment checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.support import fixture_prompts as fp
from tests.support.e2e import (
    Run,
    Stack,
    check_sample,
    echo,
    finish,
    open_session,
    stored,
    tool_result,
)

OFF = {"enable_thinking": False}
ON = {"enable_thinking": True}


@dataclass
class Agent:
    """A scripted agent: sends requests, keeps its history, and notes where segments start."""

    st: Stack
    session: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    kw: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=lambda: [Run()])
    segment_tools: list[Any] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    reserialize: bool = True  # echo calls pretty-printed (their first render in a new segment is compact)

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(
            base_url=self.session["base_url"], api_key=self.session["api_key"], max_retries=0
        )
        self.segment_tools.append(self.tools)

    def call(self, **create: Any) -> Any:
        run = self.runs[-1]
        # The reference render takes content parts as their joined text (Qwen3's template cannot
        # render a list; OpenAI's and vLLM's servers join text parts the same way).
        run.requests.append([_flat(m) for m in self.messages])
        kwargs: dict[str, Any] = {"temperature": 0.0, **create}
        if self.tools:
            kwargs["tools"] = self.tools
        if self.kw:
            kwargs["extra_body"] = {"chat_template_kwargs": self.kw}
        if self.stream:
            from tests.support.e2e import collect_stream

            msg = collect_stream(
                self.client.chat.completions.create(model="m", messages=self.messages, stream=True, **kwargs)
            )
        else:
            msg = (
                self.client.chat.completions.create(model="m", messages=self.messages, **kwargs)
                .choices[0]
                .message
            )
        run.replies.append(msg)
        return msg

    def loop(
        self, first: list[dict[str, Any]], *, followups: tuple[str, ...] = (), turns: int = 6, **create: Any
    ) -> None:
        """A tool loop: echo each reply, answer its calls, then ask the follow-ups."""
        self.messages = list(first)
        pending = list(followups)
        for _ in range(turns):
            msg = self.call(**create)
            self.messages.append(echo(msg, reserialize=self.reserialize, drop_reasoning=True))
            if msg.tool_calls:
                self.messages += [
                    {"role": "tool", "tool_call_id": c.id, "content": tool_result(c)} for c in msg.tool_calls
                ]
            elif pending:
                self.messages.append({"role": "user", "content": pending.pop(0)})
            else:
                return

    def new_segment(self, messages: list[dict[str, Any]], tools: Any = "same") -> None:
        """The agent rewrites its history (or tools): what follows is a new segment."""
        if tools != "same":
            self.tools = tools
        self.messages = list(messages)
        self.runs.append(Run())
        self.segment_tools.append(self.tools)

    def check(self, causes: list[str]) -> dict[str, Any]:
        summary = finish(self.st, self.session["session_id"])
        assert summary["rejects"] == [], summary["rejects"]
        assert [c["cause"] for c in summary["segment_causes"]] == causes
        assert [x["segment"] for x in summary["samples"]] == list(range(len(self.runs)))
        for sample in summary["samples"]:
            run, tools = self.runs[sample["segment"]], self.segment_tools[sample["segment"]]
            if run.replies:  # a completions segment has no chat run (see its own test)
                check_sample(self.st, stored(self.st, sample["cursor"]), run, tools, self.kw)
        return summary


def _flat(m: dict[str, Any]) -> dict[str, Any]:
    if isinstance(m.get("content"), list):
        return {**m, "content": "\n".join(p["text"] for p in m["content"])}
    return m


def _weather(city: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is the weather in {city}?"}]


def plain_loop(a: Agent) -> list[str]:
    a.loop(fp.WEATHER, followups=("What is the weather in Berlin?",))
    return ["start"]


def parallel_calls(a: Agent) -> list[str]:
    a.loop(fp.TWO_CITIES)
    assert len(a.runs[0].replies[0].tool_calls) == 2
    return ["start"]


def deep_rounds(a: Agent) -> list[str]:
    a.loop(
        _weather("Paris"),
        followups=("What is the weather in Berlin?", "What is the weather in Tokyo?"),
        turns=9,
    )
    return ["start"]


def after_tool_start(a: Agent) -> list[str]:
    a.loop(fp.AFTER_TOOL, followups=("What is the weather in Tokyo?",))
    return ["start"]


def second_query_start(a: Agent) -> list[str]:
    a.loop(fp.SECOND_QUERY)
    return ["start"]


def list_files(a: Agent) -> list[str]:
    a.loop(fp.LIST_TMP)
    return ["start"]


def unicode_text(a: Agent) -> list[str]:
    a.loop([{"role": "user", "content": "Wetter in Zürich? 東京は雨 🌧️ — «ça va»\r\n"}], turns=2)
    return ["start"]


def content_parts(a: Agent) -> list[str]:
    a.loop(
        [{"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]}],
        followups=("And Berlin?",),
    )
    return ["start"]


def sampled_with_seed(a: Agent) -> list[str]:
    a.loop(fp.WEATHER, temperature=1.0, seed=7, turns=3)
    return ["start"]


def sampled_hot(a: Agent) -> list[str]:
    """At 0.7 the engine's recorded logprobs are of logits / 0.7, its teacher-forced ones raw."""
    a.loop(fp.WEATHER, temperature=0.7, seed=3, turns=2)
    return ["start"]


def stop_string_last(a: Agent) -> list[str]:
    a.messages = list(fp.AFTER_TOOL)
    a.call(stop=["21"])
    return ["start"]


def cut_inside_tool_call(a: Agent) -> list[str]:
    a.messages = list(fp.WEATHER)
    msg = a.call(max_tokens=5)
    assert not msg.tool_calls
    return ["start"]


def rewrite_summary(a: Agent) -> list[str]:
    a.loop(fp.WEATHER, turns=3)
    # The summary keeps the conversation's opening (here: no system message); one with a system
    # message of its own would open a new conversation (a subagent's), not rewrite this one.
    summary = [
        {"role": "user", "content": "A summary of the work so far follows."},
        {"role": "user", "content": "Earlier: it is sunny in Paris."},
        {"role": "assistant", "content": "Noted."},
        *_weather("Berlin"),
    ]
    assert len(summary) <= len(a.messages)  # as long as before: a rewrite, not a truncation
    a.new_segment(summary)
    a.loop(a.messages, turns=3)
    return ["start", "rewrite"]


def truncation(a: Agent) -> list[str]:
    a.loop(fp.WEATHER, followups=("What is the weather in Berlin?",), turns=4)
    a.new_segment(_weather("Tokyo"))
    a.loop(a.messages, turns=3)
    return ["start", "truncation"]


def tools_changed(a: Agent) -> list[str]:
    a.reserialize = False  # the new segment renders these echoes in full
    a.loop(fp.WEATHER, turns=3)
    a.new_segment([*a.messages, *_weather("Berlin")], tools=[fp.GET_WEATHER])
    a.loop(a.messages, turns=3)
    return ["start", "tools_changed"]


def retry_last(a: Agent) -> list[str]:
    a.messages = list(fp.WEATHER)
    a.call()
    a.runs[0].requests.pop()
    a.runs[0].replies.pop()  # the agent lost that reply: the retry replaces it
    a.loop(a.messages, turns=3)
    return ["start"]


def text_echo(a: Agent) -> list[str]:
    """smolagents 1.26 (memory.py, models.get_clean_message_list): a call turn comes back as one
    assistant text message `Calling tools:\\n[{...}]` (a Python repr), the result as a user
    `Observation:` message; no `tool_calls`, no tool role."""
    a.messages = list(fp.WEATHER)
    for _ in range(3):
        msg = a.call()
        if not msg.tool_calls:
            break
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)},
            }
            for c in msg.tool_calls
        ]
        a.messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": (msg.content or "").strip() + "\nCalling tools:\n" + str(calls)}
                ],
            }
        )
        a.messages.append(
            {
                "role": "user",
                "content": [{"type": "text", "text": "Observation:\n" + tool_result(msg.tool_calls[0])}],
            }
        )
    return ["start"]


def echo_edited(a: Agent) -> list[str]:
    a.messages = list(fp.WEATHER)
    msg = a.call()
    assert msg.tool_calls
    edited = echo(msg, reserialize=False, drop_reasoning=True)
    edited["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Lyon"})
    a.messages += [
        edited,
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": tool_result(msg.tool_calls[0])},
    ]
    a.call()
    return ["start"]


def completions_then_chat(a: Agent) -> list[str]:
    a.client.completions.create(model="m", prompt="The weather in Paris is", max_tokens=4, temperature=0.0)
    a.runs[0] = Run()  # the completions segment is checked below, not as a chat run
    a.new_segment(list(fp.WEATHER))
    a.loop(a.messages, turns=3)
    return ["start", "mode_switch"]


def streamed_loop(a: Agent) -> list[str]:
    a.stream = True
    a.loop(fp.TWO_CITIES, followups=("What is the weather in Berlin?",))
    return ["start"]


def chatml_tool_loop(a: Agent) -> list[str]:
    a.tools = None
    a.loop(fp.CHATML_WEATHER, followups=("What is the weather in Berlin?",))
    return ["start"]


def chatml_two_cities(a: Agent) -> list[str]:
    a.tools = None
    a.loop(fp.CHATML_TWO_CITIES)
    return ["start"]


def chatml_list(a: Agent) -> list[str]:
    a.tools = None
    a.loop(fp.CHATML_LIST_TMP)
    return ["start"]


def chatml_plain(a: Agent) -> list[str]:
    a.tools = None
    a.loop(fp.CHATML_PLAIN, followups=("Thanks! And tomorrow?",))
    return ["start"]


def chatml_streamed(a: Agent) -> list[str]:
    a.tools, a.stream = None, True
    a.loop(fp.CHATML_TWO_CITIES, followups=("What is the weather in Berlin?",))
    return ["start"]


def chatml_rewrite(a: Agent) -> list[str]:
    a.tools = None
    a.loop(fp.CHATML_WEATHER, turns=2)
    rewritten = [
        {"role": "system", "content": fp.CHATML_SYSTEM},
        {"role": "user", "content": "Earlier: Paris."},
    ]
    a.new_segment([*rewritten, {"role": "assistant", "content": "Noted."}, *_weather("Tokyo")])
    a.loop(a.messages, turns=2)
    return ["start", "rewrite"]


def chatml_unicode(a: Agent) -> list[str]:
    a.tools = None
    a.loop([{"role": "user", "content": "Grüße aus Köln ☕ — 你好"}], turns=1)
    return ["start"]


Scenario = Callable[[Agent], list[str]]
QWEN3: list[tuple[Scenario, dict[str, Any], bool]] = [
    (plain_loop, OFF, False),
    (plain_loop, ON, False),
    (parallel_calls, OFF, False),
    (parallel_calls, ON, False),
    (deep_rounds, OFF, False),
    (deep_rounds, ON, False),
    (after_tool_start, OFF, False),
    (second_query_start, OFF, False),
    (second_query_start, ON, False),
    (list_files, OFF, False),
    (unicode_text, OFF, False),
    (content_parts, OFF, False),
    (sampled_with_seed, OFF, False),
    (sampled_hot, OFF, False),
    (stop_string_last, OFF, False),
    (cut_inside_tool_call, OFF, False),
    (cut_inside_tool_call, ON, False),  # thinking on: the cut falls inside <think>
    (rewrite_summary, OFF, False),
    (truncation, OFF, False),
    (tools_changed, OFF, False),
    (retry_last, OFF, False),
    (text_echo, OFF, False),
    (echo_edited, OFF, False),
    (completions_then_chat, OFF, False),
    (streamed_loop, OFF, True),
    (streamed_loop, ON, True),
]
CHATML: list[Scenario] = [
    chatml_tool_loop,
    chatml_two_cities,
    chatml_list,
    chatml_plain,
    chatml_streamed,
    chatml_rewrite,
    chatml_unicode,
]


@pytest.mark.parametrize(("scenario", "kw", "stream"), QWEN3, ids=lambda v: getattr(v, "__name__", None))
def test_qwen3_scenarios_are_token_exact(
    qwen3: Stack, scenario: Scenario, kw: dict[str, Any], stream: bool
) -> None:
    s = open_session(qwen3, task_id=scenario.__name__)
    agent = Agent(qwen3, s, tools=fp.TOOLS, kw=kw, stream=stream)
    causes = scenario(agent)
    summary = agent.check(causes)
    if scenario is echo_edited:
        doc = stored(qwen3, summary["samples"][0]["cursor"])
        assert doc["metadata"]["echo_edits"] == [{"turn": 0, "field": "tool_calls.arguments"}]
    if scenario is text_echo:
        doc = stored(qwen3, summary["samples"][0]["cursor"])
        assert doc["metadata"]["echo_matches"][0] == {"turn": 0, "how": "ids_in_text"}
    if scenario is retry_last:
        assert stored(qwen3, summary["samples"][0]["cursor"])["metadata"]["replaced_turns"][0]["turn"] == 0
    if scenario in (cut_inside_tool_call, stop_string_last):
        doc = stored(qwen3, summary["samples"][0]["cursor"])
        expected = "truncated" if scenario is cut_inside_tool_call else "completed"
        assert doc["status"] == expected


@pytest.mark.parametrize("scenario", CHATML, ids=lambda v: v.__name__)
def test_chatml_scenarios_are_token_exact(chatml: Stack, scenario: Scenario) -> None:
    s = open_session(chatml, task_id=scenario.__name__)
    agent = Agent(chatml, s)
    agent.check(scenario(agent))


def test_the_completions_segment_is_the_engines_ids(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="completions")
    c = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    first = c.completions.create(model="m", prompt="The weather in Paris is", max_tokens=4, temperature=0.0)
    c.completions.create(
        model="m",
        prompt="The weather in Paris is" + first.choices[0].text + " and",
        max_tokens=4,
        temperature=0.0,
    )
    summary = finish(qwen3, s["session_id"])
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    tokens, n = np.asarray(doc["tokens"]), doc["response_length"]
    mask = np.asarray(doc["loss_mask"])
    sampled = tokens[len(tokens) - n :][mask == 1].tolist()
    engine = [i for rid in doc["metadata"]["engine_rids"] for i in qwen3.recorder.by_rid[rid].output_ids]
    assert sampled == engine
    # How the embedded engine took these logprobs, and that it honours seeds (its /server_info).
    sem = doc["metadata"]["engine"]
    assert (sem["kind"], sem["logprobs"], sem["forced_logprobs"]) == ("rlgw-engine", "scaled", "raw")
    assert (sem["vocabulary"], sem["seed_honoured"]) == ("padded", True)
    r = httpx.get(qwen3.gateway + "/health")
    assert r.status_code == 200
