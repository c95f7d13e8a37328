"""The model runner: prefill, batched decode, sampling, logprobs and stop checks on a CPU model.

Owns the torch side of generation: loading a checkpoint, the forward passes (chunked prefill into a
request's own KV cache, starting after the longest prefix the prefix cache holds, and one decode
step over the left-padded running batch), turning logits into
sampled ids and log-probabilities, teacher-forced prompt logprobs in bounded memory, the stop
conditions, and the detokenized text of a snapshot. Knows nothing about queues, locks or pausing:
the scheduler (`rlgw.engine.scheduler`) decides which requests run, and this module reports back
which ones ended and why (SGLang's finish reasons) without delivering anything itself.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import torch

from rlgw.engine.batch import BatchCache, new_cache
from rlgw.engine.errors import ModelError, RequestError
from rlgw.engine.grammar import Grammars
from rlgw.engine.prefix_cache import PrefixCache
from rlgw.engine.request import Phase, Request, Update, failed, length, stopped
from rlgw.engine.sampling import SamplerRow, sample

# Prompt rows whose logits are materialized at once when computing input logprobs (bounds memory
# for long teacher-forcing calls on large vocabularies).
LOGIT_CHUNK = 256


def load_model(path: Path):
    """The tokenizer and the fp32 eval-mode causal LM of checkpoint `path` (`ModelError` if unsupported)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    _check_supported(model)
    return model, tokenizer


class ModelRunner:
    """Forward passes, sampling and stop checks for one model (called from the engine thread only).

    Trade-offs: fp32 only; a prefill reuses the longest cached prefix (`rlgw.engine.prefix_cache`)
    but never the whole sequence (its last token is fed again for the logits); the padded batch is
    rebuilt only when membership changes (see `rlgw.engine.batch`).
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer, prefix: PrefixCache, original_logprob: bool = False
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.original_logprob = original_logprob
        self._base = model.get_decoder()
        self._lm_head = model.get_output_embeddings()
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(self._base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.max_context_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        # Models pad their vocabulary beyond the tokenizer's (Qwen3: 151669 -> 151936). Logprobs are
        # normalized over the whole padded vocabulary, as SGLang's and vLLM's are (`_logits`), so a
        # trainer reproduces one distribution whichever engine served; but a padded id is never
        # sampled (`sample`'s `sample_vocab`): it has no text, and a sample holding one is rejected at
        # finish (validate_sample's bad_token), which SGLang risks with probability p(padded). The
        # price is that this engine draws from p / (1 - p(padded)) where SGLang draws from p: nil for
        # trained models (their padded rows sit near zero: p(padded) ~ 0), and a suite whose tiny
        # fixtures put ~1% on padded ids stays deterministic.
        self.tokenizer_vocab = min(len(tokenizer), self.vocab_size)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.grammars = Grammars(tokenizer, self.vocab_size, self.eos_ids)

    # -- admission checks -------------------------------------------------------------------------

    def check(self, input_ids: list[int], logprob_start_len: int) -> None:
        """Raise `RequestError` if a prompt cannot run on this model."""
        if not input_ids:
            raise RequestError("the input is empty: give at least one token")
        bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} is out of range for a vocabulary of {self.vocab_size}")
        if self.max_context_length is not None and len(input_ids) >= self.max_context_length:
            raise RequestError(
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({self.max_context_length} tokens)."
            )
        if logprob_start_len >= len(input_ids):
            raise RequestError(
                f"logprob_start_len ({logprob_start_len}) must be less than the input length "
                f"({len(input_ids)})"
            )

    # -- forward passes ---------------------------------------------------------------------------

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache
    ) -> torch.Tensor:
        kwargs = {self._cache_kwarg: cache}
        out = self._base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)
        return out.last_hidden_state

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of `hidden` over the model's whole vocabulary (config.vocab_size, padded ids included)."""
        return self._lm_head(hidden).float()

    def prefill(self, req: Request, budget: int) -> tuple[int, bool, dict | None]:
        """Feed up to `budget` more tokens of `req`'s sequence into its own KV cache.

        A fresh request's sequence is its prompt; once complete, its prompt logprobs are done and
        its first token is sampled. A retracted request re-feeds prompt + output except the last
        output id, which the next decode step feeds. Returns (tokens fed, prefill complete, finish
        reason or None); on completion `prefill_done` is reset to 0 and `req.kv` holds the cache.
        The first call starts the KV from the prefix cache's longest match, if any.
        """
        fresh = not req.output_ids
        seq = req.input_ids if fresh else req.input_ids + req.output_ids[:-1]
        if req.kv is None:
            self._start_kv(req, seq, fresh)
        lo = req.prefill_done
        hi = min(len(seq), lo + budget)
        ids = torch.tensor([seq[lo:hi]], dtype=torch.long)
        hidden = self._forward(ids, None, torch.arange(lo, hi).unsqueeze(0), req.kv)
        if fresh and req.return_logprob and req.logprob_start_len >= 0:
            self._prompt_logprobs(req, hidden[0], lo)
        if hi < len(seq):
            req.prefill_done = hi
            return hi - lo, False, None
        req.prefill_done = 0
        if not fresh:
            return hi - lo, True, None
        req.prefilled = True
        if req.params.max_new_tokens == 0:
            return hi - lo, True, length(0)
        return hi - lo, True, self._advance([req], self._logits(hidden[:, -1]))[0]

    def _start_kv(self, req: Request, seq: list[int], fresh: bool) -> None:
        """Give `req` its own cache, seeded with the longest cached prefix of `seq`.

        At least the last token is left to compute (its logits pick the next token), and prompt
        positions whose logprobs were asked for are computed, not reused (their hidden states score
        the tokens after them).
        """
        req.cache_epoch = self.prefix.epoch
        limit = len(seq) - 1
        if fresh and req.return_logprob and req.logprob_start_len >= 0:
            limit = min(limit, req.logprob_start_len)
        hit = self.prefix.match(seq, limit)
        req.kv = new_cache(hit.kv if hit else None)
        req.prefill_done = hit.length if hit else 0
        if fresh:
            req.cached_tokens = req.prefill_done

    def _prompt_logprobs(self, req: Request, hidden: torch.Tensor, lo: int) -> None:
        """Teacher-forced logprobs of prompt tokens from `logprob_start_len` (first entry null): the raw
        model's, unscaled by the request's temperature and untouched by its penalties, as SGLang's.

        `hidden` holds positions `lo ..`; position p's hidden state scores prompt token p + 1.
        """
        start = req.logprob_start_len
        if lo == req.cached_tokens:  # the first chunk of this prefill
            req.input_logprobs = [None]
            req.input_top_logprobs = [None]
        first = max(lo, start)
        end = min(lo + hidden.shape[0], len(req.input_ids) - 1)
        k = req.top_logprobs_num
        for p0 in range(first, end, LOGIT_CHUNK):
            p1 = min(p0 + LOGIT_CHUNK, end)
            # Raw logits whatever the request's temperature, as SGLang's `input_token_logprobs` are.
            lp = torch.log_softmax(self._logits(hidden[p0 - lo : p1 - lo]), dim=-1)
            tgt = torch.tensor(req.input_ids[p0 + 1 : p1 + 1], dtype=torch.long)
            req.input_logprobs.extend(lp.gather(1, tgt.unsqueeze(1)).squeeze(1).tolist())
            if k > 0:
                vals, idx = lp.topk(k, dim=1)
                req.input_top_logprobs.extend(
                    list(zip(v, i, strict=True)) for v, i in zip(vals.tolist(), idx.tolist(), strict=True)
                )

    def decode(self, batch: BatchCache) -> list[dict | None]:
        """One decode step over the running batch; the finish reason (or None) of each row."""
        ids = torch.tensor([[r.output_ids[-1]] for r in batch.reqs], dtype=torch.long)
        pos = torch.tensor([[r.seq_len - 1] for r in batch.reqs], dtype=torch.long)
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch), 1), dtype=torch.long)], dim=1)
        # Without padding the mask is all ones: let the model take its plain causal path.
        hidden = self._forward(ids, batch.mask if batch.padded else None, pos, batch.cache)
        return self._advance(batch.reqs, self._logits(hidden[:, -1]))

    # -- sampling and stop checks -------------------------------------------------------------------

    def _advance(self, reqs: list[Request], logits: torch.Tensor) -> list[dict | None]:
        """Sample one token per request, record its logprobs, and check each for a stop."""
        rows = []
        for r in reqs:
            suppress = self._stop_ids(r) if len(r.output_ids) < r.params.min_new_tokens else None
            rows.append(SamplerRow(r.params, r.generator, r.output_ids, suppress))
        # Masked before sampling, so logprobs are over what the grammar allows (as in SGLang).
        self.grammars.mask(logits, [r.grammar for r in reqs])
        need_lp = [i for i, r in enumerate(reqs) if r.return_logprob]
        ids, logprobs = sample(
            logits,
            rows,
            self.original_logprob,
            need_logprobs=bool(need_lp),
            sample_vocab=self.tokenizer_vocab,
        )
        if need_lp:
            chosen = logprobs[torch.tensor(need_lp), torch.tensor([ids[i] for i in need_lp])].tolist()
            max_k = max(reqs[i].top_logprobs_num for i in need_lp)
            top = logprobs.topk(max_k, dim=1) if max_k > 0 else None
            top_vals = top.values.tolist() if top is not None else None
            top_idx = top.indices.tolist() if top is not None else None
            for j, i in enumerate(need_lp):
                r = reqs[i]
                r.output_logprobs.append(chosen[j])
                if r.top_logprobs_num > 0 and top_vals is not None:
                    k = r.top_logprobs_num
                    r.output_top_logprobs.append(list(zip(top_vals[i][:k], top_idx[i][:k], strict=True)))
        reasons = []
        for r, tok in zip(reqs, ids, strict=True):
            r.output_ids.append(tok)
            if r.grammar is not None and not r.grammar.accept(tok):
                # Every token was masked (min_new_tokens banning the only stop the grammar allows).
                reasons.append(
                    failed(f"token {tok} is outside the request's grammar", 500, "InternalServerError")
                )
            else:
                reasons.append(self._finish_reason(r))
        return reasons

    def _stop_ids(self, r: Request) -> list[int]:
        stop = list(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            stop.extend(self.eos_ids)
        return stop

    def _finish_reason(self, r: Request) -> dict | None:
        tok = r.output_ids[-1]
        n = len(r.output_ids)
        p = r.params
        if n >= p.min_new_tokens and ((tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids):
            return stopped(tok)
        if r.grammar is not None and r.grammar.terminated:
            return stopped(tok)
        if p.stop and n >= p.min_new_tokens and (matched := self._match_stop_string(r)) is not None:
            return stopped(matched)
        if n >= p.max_new_tokens:
            return length(p.max_new_tokens)
        if self.max_context_length is not None and r.seq_len >= self.max_context_length:
            return length(n)
        return None

    def _match_stop_string(self, r: Request) -> str | None:
        longest = max(len(s) for s in r.params.stop)
        # Every token decodes to at least one character except partial UTF-8 bytes: a tail of
        # `longest + 4` tokens covers the longest stop string.
        tail = self.tokenizer.decode(
            r.output_ids[-(longest + 4) :], skip_special_tokens=r.params.skip_special_tokens
        )
        for s in r.params.stop:
            if s in tail:
                return s
        return None

    # -- output text ------------------------------------------------------------------------------

    def snapshot(self, r: Request, weight_version: str) -> Update:
        """The update a sink receives for `r` now (final once `r` is finished)."""
        final = r.phase is Phase.FINISHED
        return Update(
            n_out=len(r.output_ids),
            text=self._text(r, final),
            finish_reason=r.finish_reason,
            weight_version=weight_version,
            e2e_latency=(time.monotonic() - r.created) if final else None,
        )

    def _text(self, r: Request, final: bool) -> str:
        ids = r.output_ids
        reason = r.finish_reason or {}
        trim = final and reason.get("type") == "stop" and not r.params.no_stop_trim
        if trim and isinstance(reason.get("matched"), int):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=r.params.skip_special_tokens)
        if trim and isinstance(reason.get("matched"), str):
            cut = text.find(reason["matched"])
            if cut >= 0:
                text = text[:cut]
        if not final:
            # Hold back an incomplete UTF-8 sequence until its remaining bytes arrive.
            text = text.rstrip("\ufffd")
        return text


def _eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _check_supported(model) -> None:
    """Refuse models whose logits are not a plain `lm_head(final hidden state)`."""
    cfg = model.config
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(cfg, attr, None) not in (None, 1.0):
            raise ModelError(f"models with {attr} are not supported by the embedded engine")
    if model.get_output_embeddings() is None:
        raise ModelError("the model has no output embeddings (lm_head): not a causal LM")
