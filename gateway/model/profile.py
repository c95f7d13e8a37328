"""What the gateway knows about the served model: tokenizer, template renderer, parsers, context.

Built once at start-up from the engine's `/model_info` and the gateway's flags; read by every
turn. It knows nothing about sessions or HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlgw.gateway.errors import StartupError
from rlgw.gateway.model.fast_tokenizer import select_encoder
from rlgw.gateway.model.render import ChatRenderer, TemplateConfig, read_chat_template
from rlgw.gateway.parsing.reasoning import THINK_END, detect_reasoning
from rlgw.gateway.parsing.tool_calls import detect_tool_format, normalize_tool_format


@dataclass
class ModelProfile:
    """What the gateway knows about the served model (from the engine and the template)."""

    name: str
    tokenizer: Any
    renderer: ChatRenderer
    context_length: int
    tool_format: str | None
    reasoning: bool
    think_start_ids: tuple[int, ...] = ()
    think_end_id: int | None = None  # `</think>` when it is one token: reasoning tokens end with it
    # The operator named the tool parser (--tool-parser): tools are accepted even when the
    # template does not render them (the agent describes them in its own prompt).
    tool_parser_explicit: bool = False
    # The output cap of a turn that names none (neither the request nor its session): agents such
    # as Codex send no `max_output_tokens`, and a turn must not generate to the end of the context.
    # None: the rest of the context.
    default_max_tokens: int | None = None
    # The model's `config.vocab_size`: the rows of its embedding and output layer, often padded past
    # the tokenizer's ids (to a multiple of 64 or 128). None: no config was readable.
    model_vocab: int | None = None

    @property
    def vocab_size(self) -> int:
        """Ids the model can be fed and can sample: its whole (padded) vocabulary where its config says
        it, else the tokenizer's. SGLang and vLLM sample padded ids (their rows carry probability
        mass, little in a trained model): such an id is what the model did, and the trainers
        normalize over the same padded vocabulary; the tokenizer decodes it to nothing."""
        return self.model_vocab or len(self.tokenizer)


def _context_length(configured: int | None, info: dict[str, Any], tokenizer_dir: Path) -> int:
    if configured:
        return configured
    for key in ("max_context_length", "context_length", "max_total_num_tokens"):
        if isinstance(info.get(key), int) and info[key] > 0:
            return int(info[key])
    cfg = tokenizer_dir / "config.json"
    if cfg.is_file():
        value = json.loads(cfg.read_text()).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    raise StartupError("cannot tell the model's context length: pass --context-length")


def _model_vocab(info: dict[str, Any], tokenizer_dir: Path) -> int | None:
    """`config.vocab_size` (or its text model's, for a multimodal config) from the model's local
    config.json: the engine's model path, else the tokenizer's directory."""
    for where in (info.get("model_path"), tokenizer_dir):
        cfg = Path(str(where)) / "config.json" if where else None
        if cfg is None or not cfg.is_file():
            continue
        doc = json.loads(cfg.read_text())
        value = doc.get("vocab_size") or (doc.get("text_config") or {}).get("vocab_size")
        if isinstance(value, int) and value > 0:
            return value
    return None


def _single_token(tok: Any, text: str) -> int | None:
    ids = tok.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def build_profile(
    info: dict[str, Any],
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
    context_length: int | None = None,
    served_model_name: str | None = None,
) -> ModelProfile:
    """Load the tokenizer and template the engine serves and decide how to parse outputs."""
    from transformers import AutoTokenizer

    tok_path = tokenizer or info.get("tokenizer_path") or info.get("model_path")
    if not tok_path:
        raise StartupError("the engine's /model_info names no tokenizer_path: pass --tokenizer")
    tok = AutoTokenizer.from_pretrained(tok_path)
    template = read_chat_template(chat_template) if chat_template else None
    renderer = ChatRenderer(tok, TemplateConfig(chat_template=template), encoder=select_encoder(tok))
    template_text = template or tok.chat_template or ""
    if tool_parser == "auto":
        tool_format = detect_tool_format(template_text)
    else:
        tool_format = None if tool_parser == "none" else normalize_tool_format(tool_parser)
    if reasoning_parser == "auto":
        reasoning = detect_reasoning(template_text)
    else:
        reasoning = reasoning_parser == "qwen3"
    think = tuple(tok.encode("<think>\n", add_special_tokens=False)) if reasoning else ()
    name = served_model_name or info.get("served_model_name") or Path(str(tok_path)).name
    return ModelProfile(
        name=str(name),
        tokenizer=tok,
        renderer=renderer,
        context_length=_context_length(context_length, info, Path(str(tok_path))),
        tool_format=tool_format,
        reasoning=reasoning,
        think_start_ids=think,
        think_end_id=_single_token(tok, THINK_END) if reasoning else None,
        tool_parser_explicit=tool_parser != "auto",
        model_vocab=_model_vocab(info, Path(str(tok_path))),
    )
