"""Start-up conformance probe: how a chat template behaves, and whether increments are exact.

The gateway runs `probe_template` once per model before serving. It drives the renderer over a
synthetic agent conversation (parallel tool calls, two consecutive tool results, reasoning on
every assistant turn, a second user query) the way the ledger does: the first prompt, then per
turn the emitted assistant text (the template's own rendering of that turn, as a model trained
on it would sample it) and `render_continuation` for the messages that follow. It reports:

- whether the template is append-only (re-rendering a longer conversation keeps the text of the
  shorter one), and the two known reasons it may not be: history reasoning stripped, and
  consecutive tool results grouped into one turn;
- whether incremental rendering is exact: at every turn whose history the template leaves
  alone, the ledger's ids equal the tokenized full render; at every turn, the increment equals
  the full render's text after the previous assistant turn; and a turn cut by length (no stop
  token sampled) gets the template's closing.

It knows nothing about sessions or HTTP; the caller logs `summary()` and decides what a failed
probe means. It is pure rendering and tokenizing: tens of milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import ChatRenderer, TemplateIncompatible

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe_lookup",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]
_REASONING = ("probe-reasoning-one", "probe-reasoning-two", "probe-reasoning-three")


def _call(call_id: str, key: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "probe_lookup", "arguments": f'{{"key": "{key}"}}'},
    }


# Assistant contents are unique markers: the probe finds each turn's end in a full render by them.
_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "probe system prompt"},
    {"role": "user", "content": "probe question one"},
    {
        "role": "assistant",
        "reasoning_content": _REASONING[0],
        "content": "probe-call-one",
        "tool_calls": [_call("c1", "a"), _call("c2", "b")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "probe result a"},
    {"role": "tool", "tool_call_id": "c2", "content": "probe result b"},
    {
        "role": "assistant",
        "reasoning_content": _REASONING[1],
        "content": "probe-call-two",
        "tool_calls": [_call("c3", "c")],
    },
    {"role": "tool", "tool_call_id": "c3", "content": "probe result c"},
    {"role": "assistant", "reasoning_content": _REASONING[2], "content": "probe-answer-one"},
    {"role": "user", "content": "probe question two"},
    {"role": "assistant", "content": "probe-answer-two"},
]
_ASSISTANTS = [i for i, m in enumerate(_CONVERSATION) if m["role"] == "assistant"]
_FIRST_TOOL = 3  # _CONVERSATION[3] and [4] are consecutive tool results
# A conversation with no real user query (the task is in the system prompt; results come back
# as tool messages) and an assistant message the agent supplies itself, with reasoning, in an
# increment: templates that keep the reasoning only after the last user query (Qwen3) must
# render it in the increment as in the full render. Only _NO_QUERY_GENERATED are sampled turns.
_NO_QUERY: list[dict[str, Any]] = [
    {"role": "system", "content": "probe system prompt with the task"},
    {
        "role": "assistant",
        "reasoning_content": _REASONING[0],
        "content": "probe-call-one",
        "tool_calls": [_call("c1", "a")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "probe result a"},
    {
        "role": "assistant",
        "reasoning_content": _REASONING[1],
        "content": "probe-injected",
        "tool_calls": [_call("c2", "b")],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "probe result b"},
    {"role": "assistant", "reasoning_content": _REASONING[2], "content": "probe-answer-one"},
]
_NO_QUERY_GENERATED = [1, 5]


@dataclass
class ProbeReport:
    """What the probe found about one chat template."""

    append_only: bool  # re-rendering a longer conversation never changes the text of a shorter one
    strips_history_reasoning: bool  # reasoning of earlier turns disappears from later renders
    groups_consecutive_tools: bool  # a second tool result changes the text after the first
    increment_matches_full_render: bool  # the ledger's ids are what the template would feed, per turn
    turns: int = 0  # assistant turns simulated
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line per finding, for the start-up log."""
        lines = [
            "template is append-only"
            if self.append_only
            else "template is not append-only (a longer conversation re-renders earlier text); "
            "the ledger renders only new messages and never re-renders history",
        ]
        if self.strips_history_reasoning:
            lines.append("history <think> stripped by the template; the ledger keeps the sampled tokens")
        if self.groups_consecutive_tools:
            lines.append(
                "consecutive tool messages grouped into one turn by the template; "
                "tool results that arrive together are rendered together"
            )
        lines.append(
            f"incremental rendering matches the template's full render on all {self.turns} probe turns"
            if self.increment_matches_full_render
            else "INCREMENTAL RENDERING DOES NOT MATCH the template's full render: "
            "recorded prompts would differ from what the template renders"
        )
        lines.extend(self.notes)
        return "\n".join(lines)


def probe_template(renderer: ChatRenderer) -> ProbeReport:
    """Run the synthetic conversation through `renderer` and report the template's behaviour.

    A template that refuses the probe conversation (no tool role, say) yields a report whose
    `increment_matches_full_render` is False and whose notes say why.
    """
    started = time.perf_counter()
    try:
        return _probe(renderer, started)
    except (InvalidRequest, TemplateIncompatible) as e:
        note = f"the template failed on the probe conversation: {e}"
        return ProbeReport(False, False, False, False, elapsed_s=time.perf_counter() - started, notes=[note])


def _probe(renderer: ChatRenderer, started: float) -> ProbeReport:
    conv, tools = _CONVERSATION, _TOOLS
    notes: list[str] = []

    def text(n: int, gen: bool) -> str:
        return renderer.render_text(conv[:n], tools, add_generation_prompt=gen)

    plain = {n: text(n, False) for n in range(1, len(conv) + 1)}
    append_only = all(plain[n + 1].startswith(plain[n]) for n in range(1, len(conv)))
    append_only = append_only and all(plain[a + 1].startswith(text(a, True)) for a in _ASSISTANTS)
    groups = not plain[_FIRST_TOOL + 2].startswith(plain[_FIRST_TOOL + 1])
    renders_reasoning = _REASONING[0] in plain[_ASSISTANTS[0] + 1]
    strips = renders_reasoning and _REASONING[0] not in plain[len(conv)]
    if not renders_reasoning:
        notes.append("the template does not render reasoning_content; sampled reasoning stays in the ledger")
    thinking_off = renderer.render_text(conv[:2], tools, add_generation_prompt=True, enable_thinking=False)
    gen_off = thinking_off[len(text(2, False)) :]
    if thinking_off != text(2, True):
        notes.append(
            f"with enable_thinking=False the generation prompt is {gen_off!r}; each increment carries it"
        )

    if _emitted_text(renderer, conv, _ASSISTANTS[0]) is None:
        # The generation prompt already closes the reasoning block (thinking off): a model
        # samples no reasoning after it, so the ledger is simulated without any.
        conv = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in conv]
        notes.append("the generation prompt closes the reasoning block; probed turns carry no reasoning")
    matches = _simulate_ledger(renderer, conv, _ASSISTANTS, notes)
    no_query = _NO_QUERY
    if _emitted_text(renderer, no_query, _NO_QUERY_GENERATED[0]) is None:
        no_query = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in no_query]
    if _emitted_text(renderer, no_query, _NO_QUERY_GENERATED[0]) is None:
        # Qwen3 with thinking off: without a user query its render of a finished turn has no
        # empty think block, so no sampled turn can equal it; there is nothing to compare.
        notes.append("without a real user query the template renders finished turns unlike its prompt")
    elif not _simulate_ledger(renderer, no_query, _NO_QUERY_GENERATED, notes):
        notes.append("the conversation without a real user query is not rendered incrementally as in full")
        matches = False
    return ProbeReport(
        append_only=append_only,
        strips_history_reasoning=strips,
        groups_consecutive_tools=groups,
        increment_matches_full_render=matches,
        turns=len(_ASSISTANTS) + len(_NO_QUERY_GENERATED),
        elapsed_s=time.perf_counter() - started,
        notes=notes,
    )


def _simulate_ledger(
    renderer: ChatRenderer, conv: list[dict[str, Any]], generated: list[int], notes: list[str]
) -> bool:
    """Build the ledger over `conv` turn by turn (the turns at `generated` sampled, every other
    message supplied by the agent) and compare it with the template's full renders."""
    tools, eot, encode = _TOOLS, renderer.end_of_turn_text, renderer.tokenize

    ok = True
    ids = renderer.render_prompt(conv[: generated[0]], tools)
    ledger_text = renderer.render_text(conv[: generated[0]], tools, add_generation_prompt=True)
    prev, emitted = None, ""
    for turn, a in enumerate(generated):
        if prev is not None:
            new = conv[prev + 1 : a]
            users = [m for m in conv[: prev + 1] if m["role"] == "user"]
            anchor = users[-1] if users else None
            increment = renderer.render_continuation(
                new, tools, previous_ended_with_eos=True, anchor_user=anchor
            )
            full = renderer.render_text(conv[:a], tools, add_generation_prompt=True)
            marker = conv[prev]["content"]
            end = full.find(eot, full.rfind(marker))
            tail = full[end + len(eot) :] if end >= 0 and marker in full else None
            if tail is None or encode(tail) != increment:
                notes.append(
                    f"turn {turn}: the increment differs from the full render after the previous turn"
                )
                ok = False
            if full.startswith(ledger_text) and encode(full) != ids + increment:
                notes.append(f"turn {turn}: ledger ids differ from the tokenized full render")
                ok = False
            if turn == 1:
                # The same turn cut by length: no stop token sampled, the increment closes the turn.
                cut = renderer.render_continuation(
                    new, tools, previous_ended_with_eos=False, anchor_user=anchor
                )
                if encode(emitted[: -len(eot)]) + cut != encode(emitted) + increment:
                    notes.append(f"turn {turn}: a turn cut by length is not closed as the template closes it")
                    ok = False
            ids += increment
            ledger_text += tail or ""
        emitted = _emitted_text(renderer, conv, a)
        if emitted is None:
            notes.append(
                f"turn {turn}: the template renders a final assistant turn unlike its generation prompt"
            )
            return False
        ids += encode(emitted)
        ledger_text += emitted
        prev = a
    return ok


def _emitted_text(renderer: ChatRenderer, conv: list[dict[str, Any]], a: int) -> str | None:
    """Assistant turn `conv[a]` as a model trained on the template samples it, stop token included.

    None when the template renders that turn as something other than its generation prompt
    followed by the turn's text.
    """
    prompt = renderer.render_text(conv[:a], _TOOLS, add_generation_prompt=True)
    rendered = renderer.render_text(conv[: a + 1], _TOOLS, add_generation_prompt=False)
    eot = renderer.end_of_turn_text
    if not rendered.startswith(prompt) or eot not in rendered[len(prompt) :]:
        return None
    rest = rendered[len(prompt) :]
    return rest[: rest.index(eot) + len(eot)]
