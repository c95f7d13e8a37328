"""Turn settings that reach the engine, and per-segment counts, against a scripted engine.

A session's `seed` (the README says the session owns it), a request's `ignore_eos`, streamed
reasoning chunks that carry their logprobs, and `metadata.turns` counting a sample's own turns.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.ids import derived_seed
from tests.gateway.test_api import USER, A, _rewrite, client, finish, session
from tests.support.fault_engine import FaultEngine


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()
    fe.calls.clear()


def test_a_sessions_seed_seeds_each_turn_apart_and_the_agents_is_overridden(gw: str, fe: FaultEngine) -> None:
    seeds = []
    for _ in range(2):  # two sessions with one seed: the same seeds, turn by turn
        s = session(gw, sampling={"seed": 7})
        c = client(s)
        c.chat.completions.create(model="m", messages=USER, seed=99)
        c.chat.completions.create(model="m", messages=[*USER, {"role": "assistant", "content": "x"}, *USER])
        seeds.append([call["sampling_params"]["sampling_seed"] for call in fe.calls[-2:]])
    assert seeds[0] == seeds[1] == [derived_seed(7, 0), derived_seed(7, 1)]
    assert len({7, *seeds[0]}) == 3  # neither turn replays the other's random stream
    summary = finish(gw, s["session_id"])
    doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][0]['cursor']}", headers=A).json()
    assert doc["metadata"]["agent_sampling"] == [{"turn": 0, "sampling_seed": 99}]


def test_an_agents_own_seed_is_sent_as_it_is(gw: str, fe: FaultEngine) -> None:
    s = session(gw, mode="eval", sampling={"seed": 7})  # eval: the agent's sampling applies
    c = client(s)
    for _ in range(2):
        c.chat.completions.create(model="m", messages=USER, seed=99)
    assert [call["sampling_params"]["sampling_seed"] for call in fe.calls[-2:]] == [99, 99]
    c.chat.completions.create(model="m", messages=USER)  # none of its own: the session's, derived
    assert fe.calls[-1]["sampling_params"]["sampling_seed"] == derived_seed(7, 2)


def test_ignore_eos_reaches_the_engine(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    client(s).chat.completions.create(model="m", messages=USER, max_tokens=8, extra_body={"ignore_eos": True})
    assert fe.calls[-1]["sampling_params"]["ignore_eos"] is True
    client(s).chat.completions.create(
        model="m", messages=[*USER, {"role": "assistant", "content": "x"}, *USER]
    )
    assert "ignore_eos" not in fe.calls[-1]["sampling_params"]


def test_metadata_turns_counts_the_samples_own_turns(gw: str) -> None:
    s = session(gw, policy="segment")
    _rewrite(client(s))  # one turn in each of two segments
    summary = finish(gw, s["session_id"])
    docs = [httpx.get(gw + f"/v1/trajectories/{x['cursor']}", headers=A).json() for x in summary["samples"]]
    assert [d["metadata"]["turns"] for d in docs] == [1, 1]
    assert {d["metadata"]["session_turns"] for d in docs} == {2}


def test_streamed_reasoning_chunks_carry_their_logprobs_and_count(
    gw: str, fe: FaultEngine, tiny_qwen3: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    saved = fe.reply
    reply = [*tok.encode("<think>\nPlan.\n</think>\n\nHello there.", add_special_tokens=False), fe.eos]
    fe.reply = reply
    thought = reply.index(tok.convert_tokens_to_ids("</think>")) + 1
    try:
        s = session(gw)
        body = {"messages": USER, "stream": True, "logprobs": True, "max_tokens": 40}
        body["stream_options"] = {"include_usage": True}
        r = httpx.post(s["base_url"] + "/chat/completions", json=body, headers=_auth(s))
        s2 = session(gw)
        body2 = {"input": "hi", "stream": True, "max_output_tokens": 40}
        r2 = httpx.post(s2["base_url"] + "/responses", json=body2, headers=_auth(s2))
    finally:
        fe.reply = saved
    chunks = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    reasoning = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")]
    assert reasoning and all(c["choices"][0]["logprobs"] for c in reasoning)
    n = sum(len((c["choices"][0]["logprobs"] or {}).get("content") or []) for c in chunks if c["choices"])
    assert n == len(reply)  # every sampled token's logprob went out once
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": thought}
    events = [orjson.loads(x[6:]) for x in r2.text.splitlines() if x.startswith("data: {")]
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == thought


def _auth(s: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {s['api_key']}"}
