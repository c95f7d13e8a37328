"""Record a real tool conversation and take the viewer screenshot shown in the README (docs/viewer.png).

`rlgw serve` with the embedded engine on tests/fixtures/tiny-qwen3 (real Qwen3 chat template) records
an agent driven by the `openai` SDK: two parallel get_weather calls, their results, an answer, a second
question, another call and the final answer (greedy decoding, so the same text every time). The session
is finished with a reward, and the run page is photographed in headless Chromium: from the gateway's
own /ui when it serves it, else from `rlgw trajectories view` on the same store.

    python docs/screenshot.py [--out docs/viewer.png]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support import browser  # noqa: E402
from tests.support import fixture_prompts as fp  # noqa: E402
from tests.support.procs import FIXTURES, free_port, rlgw_process  # noqa: E402

WEATHER = {"Paris": ("sunny", 21), "Tokyo": ("rainy", 14), "Berlin": ("cloudy", 15)}


def run_agent(base_url: str, api_key: str) -> int:
    """An agent loop over the session's OpenAI endpoint; returns the number of model turns."""
    agent = openai.OpenAI(base_url=base_url, api_key=api_key)
    messages: list[dict] = list(fp.TWO_CITIES)
    turns = 0
    for question in (None, "What is the weather in Berlin?"):
        if question:
            messages.append({"role": "user", "content": question})
        for _ in range(4):
            reply = agent.chat.completions.create(
                model="tiny-qwen3", messages=messages, tools=fp.TOOLS, temperature=0, max_tokens=200
            )
            turns += 1
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for call in msg.tool_calls:
                city = json.loads(call.function.arguments).get("city", "Paris")
                sky, temp = WEATHER.get(city, ("clear", 20))
                result = fp.weather_result(city, sky, temp)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "viewer.png")
    args = ap.parse_args()
    if why := browser.missing():
        raise SystemExit(f"docs/screenshot.py: {why}")
    model = FIXTURES / "tiny-qwen3"
    with tempfile.TemporaryDirectory() as data:
        port = free_port()
        serve = ["serve", "--model", str(model), "--port", str(port), "--data-dir", data]
        with rlgw_process(serve, "/health", port) as gw:
            session = httpx.post(gw + "/v1/sessions", json={"task_id": "weather-three-cities"}).json()
            turns = run_agent(session["base_url"], session["api_key"])
            summary = httpx.post(
                f"{gw}/v1/sessions/{session['session_id']}/finish",
                json={"reward": 1.0, "termination_reason": "agent_done"},
            ).json()
            cursor = summary["samples"][0]["cursor"]
            print(f"recorded {turns} turns: {summary['trainable_tokens']} trainable tokens, cursor {cursor}")
            if httpx.get(gw + "/ui").status_code == 200:
                shoot(gw, cursor, args.out)
                return
        port = free_port()
        view = ["trajectories", "view", "--data-dir", data, "--port", str(port), "--tokenizer", str(model)]
        with rlgw_process(view, "/ui", port) as url:
            shoot(url, cursor, args.out)


def shoot(url: str, cursor: int, out: Path) -> None:
    """The run page, all tokens drawn, as a PNG."""
    with browser.browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        page.goto(f"{url}/ui/runs/{cursor}")
        total = page.get_attribute(".tokens", "data-total")
        page.wait_for_selector(f'.tokens[data-loaded="{total}"]')
        # Show the per-token read-out (kind, logprob, probability) on a sampled token with visible text.
        page.locator(".tokens .tok.k1").filter(has_text=re.compile(r"\w{3}")).nth(3).hover()
        page.screenshot(path=str(out), full_page=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
