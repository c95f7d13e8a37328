"""What the trajectory viewer shows, computed from stored samples: runs, turns and classified tokens.

A *run* is one finished session: its accepted segments are committed in one transaction, so their
cursors are consecutive and a newest-first scan of the store meets them as one contiguous group.
A *token view* gives every token of a sample its text and a kind: sampled (loss mask 1), tool output,
prompt text (system/user) or template glue (special tokens and role headers). Kinds are read off the
tokens themselves (role headers after special tokens, `<tool_response>` blocks), so they hold for
ChatML-style templates (Qwen, SmolLM2) and degrade to "prompt vs template" for others; the loss mask,
not this classification, is what training uses.

This module knows nothing about HTTP or HTML (`viewer` owns those) and never writes to the store.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlgw.gateway.parsing.tool_calls import TOOL_CALL_END, TOOL_CALL_START, parse_block
from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.store import SampleSummary

# Token kinds (small ints on the wire; the page maps them to colours).
PROMPT, SAMPLED, TOOL, TEMPLATE = 0, 1, 2, 3
KIND_NAMES = ("prompt", "sampled", "tool", "template")
_TOOL_ROLES = frozenset({"tool", "ipython", "function", "observation"})
_TOOL_OPEN, _TOOL_CLOSE = "<tool_response>", "</tool_response>"


@dataclass
class Run:
    """One task run (session) as stored: its segments' summaries, oldest segment first."""

    segments: list[SampleSummary]

    @property
    def first(self) -> SampleSummary:
        """The run's first stored segment (its cursor names the run)."""
        return self.segments[0]

    @property
    def status(self) -> str:
        """The segments' status if they agree, else each distinct one in order, comma-separated."""
        seen = list(dict.fromkeys(s.status for s in self.segments))
        return ", ".join(seen)

    @property
    def trainable_tokens(self) -> int:
        """Mask-1 tokens over all segments."""
        return sum(s.trainable_tokens for s in self.segments)

    @property
    def weight_versions(self) -> list[str]:
        """Every policy version that sampled tokens of the run, in order of first use."""
        return list(dict.fromkeys(v.version for s in self.segments for v in s.weight_versions))

    @property
    def termination_reason(self) -> str | None:
        """Why the run ended, as the scaffold or gateway reported it."""
        return self.first.metadata.get("termination_reason")

    def matches(self, *, task: str = "", status: str = "", reason: str = "") -> bool:
        """Filter: substring of the task id, exact status of any segment, substring of the reason."""
        if task and task.lower() not in self.first.task_id.lower():
            return False
        if status and all(s.status != status for s in self.segments):
            return False
        return not reason or reason.lower() in str(self.termination_reason or "").lower()


@dataclass
class ConversationNode:
    """One conversation of a run, for its tree: its segments (as shown) and the ones it opened."""

    conversation: int
    parent: int | None
    segments: list[dict[str, Any]] = field(default_factory=list)
    children: list[ConversationNode] = field(default_factory=list)


def conversation_tree(segments: list[dict[str, Any]]) -> list[ConversationNode]:
    """The run's conversations as a forest, roots first, each segment under its conversation.

    Each shown segment names its `conversation` and `parent` (samples stored before conversations
    name neither: they are all the one conversation 0). A parent no stored segment names (its
    segments were all rejected) is shown as a node of its own, so no conversation is left out.
    """
    nodes: dict[int, ConversationNode] = {}
    for seg in segments:
        c = int(seg.get("conversation") or 0)
        node = nodes.setdefault(c, ConversationNode(c, seg.get("parent")))
        node.segments.append(seg)
    for c in sorted(nodes):
        parent = nodes[c].parent
        if parent is not None and parent not in nodes:
            nodes[parent] = ConversationNode(parent, None)
    roots = []
    for c in sorted(nodes):
        node = nodes[c]
        if node.parent is None or node.parent == c:
            roots.append(node)
        else:
            nodes[node.parent].children.append(node)
    return roots


def group_runs(rows: Iterable[SampleSummary]) -> Iterator[Run]:
    """Newest-first summaries -> runs, newest first, each run's segments oldest first.

    A run is yielded once a row of another session follows it; the last one at the end of `rows`.
    """
    current: list[SampleSummary] = []
    for row in rows:
        if current and row.session_id != current[0].session_id:
            yield Run(current[::-1])
            current = []
        current.append(row)
    if current:
        yield Run(current[::-1])


@dataclass
class Turn:
    """One generated turn of a segment: a maximal run of mask-1 tokens."""

    index: int
    start: int  # absolute token index (into `tokens`)
    end: int
    finish: str | None
    mean_logprob: float
    calls: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def turn_spans(sample: Sample) -> list[tuple[int, int]]:
    """[start, end) of every mask-1 run, as absolute token indices."""
    mask = np.asarray(sample.loss_mask, dtype=np.int8)
    edges = np.diff(np.concatenate([[0], mask, [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    p = sample.prompt_length
    return [(int(s) + p, int(e) + p) for s, e in zip(starts, ends, strict=True)]


def turns(sample: Sample, texts: list[str] | None, tool_format: str | None) -> list[Turn]:
    """The sample's generated turns with their finish reason, mean logprob, tool calls and parse errors."""
    finish = sample.metadata.get("turn_finish") or []
    errors = sample.metadata.get("tool_parse_errors") or []
    lp = sample.rollout_log_probs
    p = sample.prompt_length
    out = []
    for i, (s, e) in enumerate(turn_spans(sample)):
        turn = Turn(
            index=i,
            start=s,
            end=e,
            finish=finish[i] if i < len(finish) else None,
            mean_logprob=float(np.mean(lp[s - p : e - p])),
            errors=[err for err in errors if err.get("turn") == i],
        )
        if texts is not None and tool_format is not None:
            turn.calls = tool_calls("".join(texts[s:e]), tool_format)
        out.append(turn)
    return out


_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(" + re.escape(TOOL_CALL_END) + r"|$)", re.DOTALL)


def tool_calls(text: str, tool_format: str) -> list[dict[str, str]]:
    """The calls in a turn's sampled text, parsed as the gateway parsed them for the agent."""
    calls = []
    for m in _BLOCK.finditer(text):
        parsed = parse_block(tool_format, m.group(1), {}, terminated=bool(m.group(2)))
        calls += [{"name": name, "arguments": args} for name, args in parsed.calls]
    return calls


@dataclass
class TokenView:
    """Every token of one sample: its text, kind and (on sampled tokens) logprob."""

    texts: list[str]
    kinds: np.ndarray  # uint8, one of PROMPT/SAMPLED/TOOL/TEMPLATE
    logprobs: np.ndarray  # float32, NaN where the token was not sampled

    def page(self, start: int, count: int) -> dict[str, Any]:
        """Tokens [start, start+count) in the wire form the page renders (parallel arrays)."""
        end = min(start + count, len(self.texts))
        lps = self.logprobs[start:end]
        return {
            "start": start,
            "total": len(self.texts),
            "text": self.texts[start:end],
            "kind": self.kinds[start:end].tolist(),
            "lp": [None if math.isnan(x) else round(float(x), 4) for x in lps],
        }


def decode_each(tokenizer: Any, ids: np.ndarray) -> list[str]:
    """Each id decoded on its own (special tokens kept), in one batched call into the Rust tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    single = [[int(i)] for i in ids]
    if backend is not None:
        return backend.decode_batch(single, skip_special_tokens=False)
    return tokenizer.batch_decode(single, skip_special_tokens=False)


def token_view(sample: Sample, tokenizer: Any | None) -> TokenView:
    """Classify every token of `sample`; without a tokenizer, tokens show as `<id>` and mask-0 as prompt."""
    ids = np.asarray(sample.tokens)
    n = len(ids)
    mask = np.zeros(n, np.uint8)
    mask[sample.prompt_length :] = sample.loss_mask
    logprobs = np.full(n, np.nan, np.float32)
    sampled = mask == 1
    logprobs[sample.prompt_length :][sample.loss_mask == 1] = sample.rollout_log_probs[sample.loss_mask == 1]
    if tokenizer is None:
        kinds = np.where(sampled, SAMPLED, PROMPT).astype(np.uint8)
        return TokenView([f"<{int(i)}>" for i in ids], kinds, logprobs)
    texts = decode_each(tokenizer, ids)
    special = set(tokenizer.all_special_ids)
    kinds = np.empty(n, np.uint8)
    role, header, header_text, in_tool = "", False, "", False
    for i, text in enumerate(texts):
        if int(ids[i]) in special:
            # A special token opens (or closes) a message: what follows up to a newline is its header.
            kind, header, header_text, in_tool = TEMPLATE, True, "", False
        elif header:
            kind = TEMPLATE
            header_text += text
            if "\n" in text:
                header = False
                if name := header_text.strip():
                    role = name.lower()
        elif _TOOL_OPEN in text:
            kind, in_tool = TEMPLATE, True
        elif _TOOL_CLOSE in text:
            kind, in_tool = TEMPLATE, False
        else:
            kind = TOOL if in_tool or role in _TOOL_ROLES else PROMPT
        kinds[i] = SAMPLED if sampled[i] else kind
    return TokenView(texts, kinds, logprobs)
