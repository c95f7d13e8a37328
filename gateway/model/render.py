"""Chat-template rendering for the token ledger: whole first prompts, then increments only.

The model's chat template (from the tokenizer, or a `--chat-template` override) turns messages
into prompt text. Turn 1 renders the whole initial prompt. Every later turn renders only the
messages that are new since the assistant turn the engine sampled, so a turn costs what its
increment costs, never what the history costs.

Templates are not append-only (Qwen3 drops the reasoning of earlier turns and groups
consecutive tool results into one user turn), so an increment is rendered *in context*: after
a tiny anchor conversation `[user, assistant SENTINEL]` that stands in for the history. The
text after the anchor assistant's content is exactly what the template emits after an
assistant turn: the closing of that turn, the new messages (grouped as the template groups
them), and the generation prompt. The engine's sampled ids normally already end with the
end-of-turn token, so its text is cut from the front of the increment; a turn cut by length
keeps the template's whole closing.

This module owns message normalization (OpenAI shapes -> what templates accept), rendering
and tokenizing. It does not decide which messages are new (the ledger does), never sees
sampled ids, and never re-renders what the ledger holds. `template_probe` checks, at start-up,
that a given template renders increments the way this module assumes.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import orjson
import xxhash
from transformers import PreTrainedTokenizerBase

try:  # transformers' compiled-template cache (private): without it increments are always rendered
    from transformers.utils.chat_template_utils import _compile_jinja_template
except ImportError:  # pragma: no cover - depends on the transformers release
    _compile_jinja_template = None

from rlgw.gateway.content import content_text, non_text_part
from rlgw.gateway.errors import GatewayError, InvalidRequest
from rlgw.gateway.model.fast_tokenizer import HFEncoder, TextEncoder
from rlgw.gateway.model.increment_cache import IncrementCache, guarded_template

# Plain text that templates pass through unchanged; it marks where the anchor assistant's
# content ends. It never reaches the engine (only text after it is tokenized).
SENTINEL = "rlgw-anchor-5d1f0c"
_ANCHOR: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": SENTINEL},
)
# Names apply_chat_template takes for itself: never valid as template kwargs.
_RESERVED_KWARGS = frozenset(
    name
    for name, p in inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters.items()
    if p.kind is not p.VAR_KEYWORD and name != "self"
) | {"messages"}
# The renderer's own parameters: a template kwarg with one of these names would collide with them.
_RENDERER_PARAMS = frozenset({"tools", "new_messages", "previous_ended_with_eos", "anchor_user", "as_array"})
# OpenAI content-part types that carry text.


def check_template_kwargs(kwargs: Mapping[str, Any]) -> None:
    """400 naming the first key of `chat_template_kwargs` that the renderer sets itself."""
    for key in kwargs:
        if not isinstance(key, str) or key in _RESERVED_KWARGS or key in _RENDERER_PARAMS:
            raise InvalidRequest(
                f"chat_template_kwargs may not set {key!r}: the gateway sets it itself",
                param=f"chat_template_kwargs.{key}",
            )


class TemplateIncompatible(GatewayError):
    """The chat template cannot be rendered incrementally the way the ledger needs."""


@dataclass(frozen=True)
class TemplateConfig:
    """How prompts are rendered: a template override and template kwargs for every request.

    `chat_template` is Jinja text (None: the tokenizer's own template); `read_chat_template`
    turns a `--chat-template` argument into it. `template_kwargs` (e.g. `{"enable_thinking":
    False}`) are passed to every render; per-request kwargs override them.
    """

    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


def read_chat_template(value: str) -> str:
    """The template text of a `--chat-template` argument: a file path, or Jinja text itself."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a readable file nor Jinja template text")


class ChatRenderer:
    """Renders conversations through one tokenizer's chat template into token ids.

    - `render_prompt`: the whole first prompt, generation prompt included.
    - `render_continuation`: the ids to append after a sampled assistant turn; renders only
      the new messages plus a two-message anchor (cost grows with the increment and the tools
      list, not with the history).
    - Text is tokenized with special tokens parsed and no BOS/EOS added (templates write their
      own special tokens), exactly as `apply_chat_template(tokenize=True)` does.

    Trade-off: the anchor stands in for the real history, so a template whose rendering of a
    message depends on more than "an assistant turn came before it" (message numbering, say)
    renders increments wrongly; `template_probe.probe_template` detects that at start-up.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: TemplateConfig = TemplateConfig(),
        encoder: TextEncoder | None = None,
    ) -> None:
        self._tok = tokenizer
        # Rendered text -> ids: HF `tokenizers` unless the caller picked an encoder that gives the
        # same ids faster (gateway/model/fast_tokenizer.py: fastokens for byte-level BPE).
        self._encoder = encoder or HFEncoder(tokenizer)
        self._encode = self._encoder.encode
        self._encode_array = self._encoder.encode_array
        self._config = config
        self._kwargs = dict(config.template_kwargs)
        # Increments of shapes already seen are filled in, not rendered (increment_cache.py).
        self._increments = IncrementCache()
        self._guarded: dict[str, jinja2.Template] = {}  # template source -> its guarded copy
        try:
            tokenizer.get_chat_template(config.chat_template)
        except ValueError as e:
            raise TemplateIncompatible(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; pass one with --chat-template"
            ) from e
        closing = self._assistant_closing()
        first = self.tokenize(closing)[0]
        self._eot_id = (
            first if first in set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder) else None
        )
        self._eot_text = tokenizer.convert_ids_to_tokens(first) if self._eot_id is not None else ""
        if self._eot_id is None or not closing.startswith(self._eot_text):
            raise TemplateIncompatible(
                f"the chat template closes an assistant turn with {closing!r}, which does not start with "
                "a special token: the engine's stop token cannot be matched to the template's turn end"
            )
        # Whether increments carry the tool list, for a history with a user turn and for one
        # without (a template may write tools into the *first* user message, as Llama 3.1's
        # tools_in_user_message does: that message can be an increment's).
        self._tools_after_user = self._tools_reach_continuations(_ANCHOR[0])
        self._tools_without_user = self._tools_reach_continuations(None)
        self._renders_tools = self._tools_reach_prompts()

    def _tools_reach_prompts(self) -> bool:
        """Whether the template writes anything about tools at all (SmolLM2's stock one does not)."""
        probe = [{"role": "user", "content": "y"}]
        tool = {"type": "function", "function": {"name": "rlgw_probe_tool", "parameters": {"type": "object"}}}
        try:
            return self._render(probe, [tool], True, {}) != self._render(probe, None, True, {})
        except GatewayError:
            return False

    @property
    def renders_tools(self) -> bool:
        """Whether a request's tools reach the prompt (if not, tools must be refused, not ignored)."""
        return self._renders_tools

    def _tools_reach_continuations(self, anchor_user: dict | None) -> bool:
        """Whether the template writes anything about tools after an assistant turn.

        Most templates (Qwen3, ChatML, Llama 3) render tools once, in the system block at the
        top; rendering them again in every turn's increment costs time that grows with the tool
        list, for text that is then thrown away. Templates that do repeat tools later (Mistral
        puts them before the last user turn) keep getting them. `anchor_user` as in
        `render_continuation` (None: a history without a user turn).
        """
        probe = [{"role": "user", "content": "y"}]
        tool = {"type": "function", "function": {"name": "rlgw_probe_tool", "parameters": {"type": "object"}}}
        try:
            with_tools = self._increment(probe, [tool], True, {}, anchor_user)
            without = self._increment(probe, None, True, {}, anchor_user)
        except GatewayError:
            return True
        return with_tools != without

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer this renderer encodes with."""
        return self._tok

    @property
    def encoder_name(self) -> str:
        """Which encoder turns rendered text into ids ("fastokens", "tokenizers", ...)."""
        return self._encoder.name

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that end an assistant turn: the template's end-of-turn token, then EOS if different."""
        ids = [self._eot_id]
        eos = self._tok.eos_token_id
        if eos is not None and eos != self._eot_id:
            ids.append(eos)
        return ids

    @property
    def end_of_turn_id(self) -> int:
        """The template's end-of-turn token id (the first of `stop_token_ids`)."""
        return self._eot_id

    @property
    def end_of_turn_text(self) -> str:
        """The text of the template's end-of-turn token (e.g. `<|im_end|>`)."""
        return self._eot_text

    def normalize(self, messages: list[dict]) -> list[dict]:
        """OpenAI-shaped messages -> what chat templates accept (new dicts; inputs untouched).

        `content: None` becomes "" (Qwen3's template raises on None); a list of content parts
        becomes its text parts joined by "\\n" (as vLLM does for string-content templates);
        non-text parts are refused. Tool-call `function.arguments` given as a JSON object string
        (OpenAI's shape) become a mapping, so that templates that apply `tojson` do not encode a
        string twice; arguments that are not a JSON object stay as given. None-valued keys
        other than content are dropped (templates test for presence, not for None).
        """
        return [self._normalize_one(i, m) for i, m in enumerate(messages)]

    def render_text(
        self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool, **kwargs: Any
    ) -> str:
        """The plain full render of `messages` (for the first prompt, the probe and tests)."""
        return self._render(self.normalize(messages), tools, add_generation_prompt, kwargs)

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, **kwargs: Any) -> list[int]:
        """Ids of the whole first prompt, ending with the generation prompt."""
        if not messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        return self.tokenize(self.render_text(messages, tools, add_generation_prompt=True, **kwargs))

    def render_continuation(
        self,
        new_messages: list[dict],
        tools: list[dict] | None,
        *,
        previous_ended_with_eos: bool,
        anchor_user: dict | None = None,
        as_array: bool = False,
        **kwargs: Any,
    ) -> list[int] | np.ndarray:
        """Ids to append after the last sampled assistant turn (an int32 array with `as_array`).

        They hold the template's closing of that turn (only when the generation did not end
        with the end-of-turn token, e.g. cut by length), the new messages rendered as the
        template renders them after an assistant turn (consecutive tool results grouped
        together), and the generation prompt for `kwargs` (with `enable_thinking=False`, Qwen3's
        empty think block). Nothing before the new messages is rendered.

        `previous_ended_with_eos`: the sampled ids end with one of `stop_token_ids`. The text of
        the template's end-of-turn token is then cut from the front of the increment (the model
        already emitted it); otherwise the increment starts with the template's whole closing.

        `anchor_user`: the conversation's last user message before the new messages (None: it
        has none). The anchor stands in for the history with it, so templates that treat the
        messages after the last real user query differently (Qwen3 keeps their reasoning)
        render the increment as the full render does; with none, the anchor has no user turn.
        """
        if not new_messages:
            raise ValueError("render_continuation needs at least one new message")
        uses_tools = self._tools_after_user if anchor_user is not None else self._tools_without_user
        tools = tools if uses_tools else None
        tokenize = self.tokenize_array if as_array else self.tokenize
        return self._increment(new_messages, tools, previous_ended_with_eos, kwargs, anchor_user, tokenize)

    def _increment(
        self,
        new_messages: list[dict],
        tools: list[dict] | None,
        previous_ended_with_eos: bool,
        kwargs: Mapping,
        anchor_user: dict | None,
        tokenize: Callable[[str], Any] | None = None,
    ) -> Any:
        tokenize = tokenize or self.tokenize
        messages = self.normalize(new_messages)
        anchor = [_ANCHOR[1]] if anchor_user is None else [self._normalize_one(0, anchor_user), _ANCHOR[1]]

        def tail(new: list[dict], render: Callable[..., str] = self._render) -> str:
            return self._tail(anchor, new, tools, previous_ended_with_eos, kwargs, render)

        def placeholder_tail(new: list[dict]) -> str:
            return tail(new, self._render_compiled)

        if _compile_jinja_template is None:
            return tokenize(tail(messages))
        context = (
            _digest(anchor[0]) if anchor_user is not None else None,
            _digest(tools) if tools else None,
            orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS) if kwargs else b"",
            previous_ended_with_eos,
        )
        return tokenize(self._increments.text(context, messages, tail, placeholder_tail))

    def _tail(
        self,
        anchor: list[dict],
        messages: list[dict],
        tools: list[dict] | None,
        previous_ended_with_eos: bool,
        kwargs: Mapping,
        render: Callable[..., str],
    ) -> str:
        """The text after the anchor assistant's content: the increment (see `render_continuation`)."""
        try:
            text = render([*anchor, *messages], tools, True, kwargs)
        except InvalidRequest:
            if len(anchor) == len(_ANCHOR):
                raise
            # A template that insists on a user turn first: the plain anchor is the best stand-in.
            text = render([*_ANCHOR, *messages], tools, True, kwargs)
        at = text.find(SENTINEL)
        if at < 0:
            raise TemplateIncompatible("the chat template dropped the anchor assistant's content")
        tail = text[at + len(SENTINEL) :]
        if not tail.startswith(self._eot_text):
            raise TemplateIncompatible(
                f"after an assistant turn the template emitted {tail[:40]!r}, not {self._eot_text!r}"
            )
        return tail[len(self._eot_text) :] if previous_ended_with_eos else tail

    def tokenize(self, text: str) -> list[int]:
        """Ids of rendered text: special tokens parsed, no BOS/EOS added (templates write their own)."""
        return self._encode(text)

    def tokenize_array(self, text: str) -> np.ndarray:
        """`tokenize` as an int32 array (the turn's engine input is one)."""
        return self._encode_array(text)

    def _assistant_closing(self) -> str:
        """What the template writes after an assistant turn's content when nothing follows."""
        try:
            text = self._render(list(_ANCHOR), None, False, {})
        except InvalidRequest as e:
            raise TemplateIncompatible(f"the chat template refuses a user/assistant exchange: {e}") from e
        at = text.find(SENTINEL)
        closing = text[at + len(SENTINEL) :] if at >= 0 else ""
        if not closing:
            raise TemplateIncompatible(
                "the chat template does not render an assistant turn's content followed by a turn end"
            )
        return closing

    def _render(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, kwargs: Mapping
    ) -> str:
        tools = tools or None  # `if tools` in templates: an empty list means no tools
        if reserved := _RESERVED_KWARGS.intersection(kwargs):
            raise InvalidRequest(
                f"chat template kwargs may not set {sorted(reserved)}", param="chat_template_kwargs"
            )
        try:
            return self._tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self._tok.get_chat_template(self._config.chat_template, tools),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **{**self._kwargs, **kwargs},
            )
        except (jinja2.TemplateError, TypeError) as e:
            # The template refused the conversation ("roles must alternate"), or tripped over a
            # value of a shape it does not expect (templates are code run over agent input).
            raise InvalidRequest(f"the chat template rejected the messages: {e}", param="messages") from e

    def _render_compiled(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, kwargs: Mapping
    ) -> str:
        """The template, in its guarded copy (`increment_cache.guarded_template`), run on `messages`
        as they are: `apply_chat_template` turns every value into a plain JSON type first, which
        would strip the increment cache's placeholders of what makes them notice being read. What
        this render may do differently (it skips transformers' message clean-up) the cache's
        comparison with a real render catches."""
        source = self._tok.get_chat_template(self._config.chat_template, tools)
        template = self._guarded.get(source)
        if template is None:
            assert _compile_jinja_template is not None
            environment = _compile_jinja_template(source).environment
            template = self._guarded[source] = guarded_template(environment, source)
        values = {**self._tok.special_tokens_map, **self._kwargs, **kwargs}
        try:
            return template.render(
                messages=messages,
                tools=tools or None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **values,
            )
        except (jinja2.TemplateError, TypeError) as e:
            raise InvalidRequest(f"the chat template rejected the messages: {e}", param="messages") from e

    @staticmethod
    def _normalize_one(index: int, message: Any) -> dict:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"messages[{index}] must be an object with a string 'role'", param="messages"
            )
        out = {k: v for k, v in message.items() if v is not None}
        out["content"] = _content_text(index, message.get("content"))
        if "tool_calls" in out:
            out["tool_calls"] = [_normalize_tool_call(index, c) for c in out["tool_calls"]]
        return out


def _digest(value: Any) -> int:
    return xxhash.xxh3_128_intdigest(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _content_text(index: int, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content_text(content)
    if isinstance(content, list):
        kind = non_text_part(content)
        if kind is not None:
            raise InvalidRequest(
                f"messages[{index}].content: unsupported content part {kind!r} (text only)",
                param=f"messages[{index}].content",
            )
        return content_text(content)
    raise InvalidRequest(
        f"messages[{index}].content must be a string, a list of text parts, or null",
        param=f"messages[{index}].content",
    )


def _normalize_tool_call(index: int, call: Any) -> Any:
    if not isinstance(call, Mapping):
        raise InvalidRequest(f"messages[{index}].tool_calls entries must be objects", param="messages")
    function = call.get("function")
    if not isinstance(function, Mapping):
        return dict(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    elif arguments is None:
        arguments = {}
    return {**call, "function": {**function, "arguments": arguments}}
