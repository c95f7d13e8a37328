"""The settings every adapter reads, and the sampling it hands the gateway."""

from __future__ import annotations

import pytest

from rlgw.integrations.rollout import AgentRunner, ScaffoldRunner, session_sampling
from rlgw.integrations.settings import RlgwSettings, SettingsError, load_object


def test_trainer_sampling_becomes_session_sampling() -> None:
    # slime/verl/SkyRL hand SGLang or vLLM names; the gateway's session takes its own keys only.
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_new_tokens": 64, "stop": None}
    params |= {
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "logprobs": True,
        "repetition_penalty": 1.0,
    }
    assert session_sampling(params) == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 64}
    assert session_sampling(None) == {}


def test_settings_come_from_the_mapping_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGW_GATEWAY_URL", "http://env:8000")
    monkeypatch.setenv("RLGW_RUNNER", "scaffold:rlgw-mini")
    s = RlgwSettings.from_mapping({"max_turns": "3", "scaffold_options": {"python": "/usr/bin/python3"}})
    assert (s.gateway_url, s.runner, s.max_turns) == ("http://env:8000", "scaffold:rlgw-mini", 3)
    runner = s.build_runner()
    assert isinstance(runner, ScaffoldRunner) and runner.scaffold == "rlgw-mini" and runner.max_turns == 3
    assert RlgwSettings.from_mapping({"gateway_url": "http://given"}).gateway_url == "http://given"


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({}, "no rlgw gateway"),
        ({"gateway_url": "http://x", "max_turns": "many"}, "max_turns must be an integer"),
        ({"gateway_url": "http://x", "scaffold_options": "python"}, "scaffold_options must be a mapping"),
    ],
)
def test_bad_settings_name_the_setting(monkeypatch: pytest.MonkeyPatch, given: dict, match: str) -> None:
    monkeypatch.delenv("RLGW_GATEWAY_URL", raising=False)
    with pytest.raises(SettingsError, match=match):
        RlgwSettings.from_mapping(given)


def test_runners_by_name() -> None:
    base = {"gateway_url": "http://x"}
    agent = RlgwSettings.from_mapping(
        {**base, "runner": "tests.integrations.agents:rewrite_agent"}
    ).build_runner()
    assert isinstance(agent, AgentRunner)
    with pytest.raises(SettingsError, match="needs reward"):
        RlgwSettings.from_mapping({**base, "runner": "chat"}).build_runner()
    with pytest.raises(SettingsError, match="cannot load"):
        RlgwSettings.from_mapping({**base, "runner": "tests.integrations.agents:nope"}).build_runner()
    with pytest.raises(SettingsError, match="not a dotted path"):
        load_object("nodots")
