"""Generate reference/environment.md: every environment variable the code reads, found by scanning the source.

The meanings live here, beside the scan; the build fails when the code reads a variable this table does not
describe, or the table describes one the code no longer reads, so the page cannot go stale silently.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import mkdocs_gen_files

from rlgw.integrations.settings import RlgwSettings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("gateway", "engine", "sync", "sandboxes", "scaffolds", "trainer", "integrations", "bin")
# Read inside a sandbox by the launchers rlgw copies there, from values rlgw itself sets.
IN_SANDBOX = ROOT / "scaffolds" / "in_sandbox"
_READS = [
    re.compile(p, re.M)
    for p in (
        r'environ\.get\(\s*"([A-Z][A-Z0-9_]+)"',
        r'environ\[\s*"([A-Z][A-Z0-9_]+)"\s*\]',
        r'getenv\(\s*"([A-Z][A-Z0-9_]+)"',
        r'"([A-Z][A-Z0-9_]+)"\s+(?:not\s+)?in\s+os\.environ',
        r'^\w+_ENV\s*=\s*"([A-Z][A-Z0-9_]+)"',
        r'opt_in_var\s*=\s*"([A-Z][A-Z0-9_]+)"',
    )
]

PRODUCT = {
    "RLGW_ADMIN_KEY": "`rlgw serve`: the admin key (tenants API, `/metrics`); `rlgw tenants`: the key it"
    " sends. Or `--admin-key-file`; never on the command line.",
    "RLGW_TENANT_KEYS": "`rlgw serve`: static tenant keys, `tenant:key` pairs separated by commas (or"
    " `--tenant-keys-file`).",
    "RLGW_URL": "`rlgw tenants`: the gateway to manage (default `http://127.0.0.1:8000`; `--url` wins).",
    "RLGW_API_KEY": "`rlgw run`: the tenant key for the gateway when `--gateway-key` is not given.",
    "RLGW_DATA_DIR": "The data dir (store, journal, tenants) when `--data-dir` is not given; else"
    " `$XDG_DATA_HOME/rlgw`, else `~/.local/share/rlgw`.",
    "XDG_DATA_HOME": "The data dir's parent when neither `--data-dir` nor `RLGW_DATA_DIR` is set.",
    "RLGW_CACHE_DIR": "Root of rlgw's cache; the embedded engine's converted models go under `models/`"
    " (default `~/.cache/rlgw`).",
    "RLGW_FAST_TOKENIZER": "`0` turns the `fastokens` encoder off (HF `tokenizers` for everything).",
    "RLGW_SYNC_WORKERS": "Threads that encode and apply weight versions (default: min(4, CPUs)).",
    "SGLANG_RETURN_ORIGINAL_LOGPROB": "`rlgw engine`: `1`/`true` returns the logprobs of the raw logits, as"
    " SGLang's variable of that name does (`--return-original-logprob`).",
    "ROCK_BASE_URL": "`--sandbox rock`: the ROCK server.",
    "ROCK_API_KEY": "`--sandbox rock`: its API key.",
    "ROCK_IMAGE": "`--sandbox rock`: the sandbox image (default: the scaffold's).",
    "RANK": "Set by torchrun: `rlgw train --nproc-per-node` re-execs under torchrun unless it is set; rank 0"
    " runs the loop.",
    "LOCAL_RANK": "Set by torchrun: the CUDA device of a Megatron rank.",
    "RLGW_TEST_KILL_AT": "Test hook: kills the gateway at a named point of `finish` (the retry tests).",
}
TESTS = {
    "RLGW_LONG": "`1` runs the `long` tier (learning curves, SmolLM2 on vLLM).",
    "RLGW_VLLM": "`1` builds the vLLM venv the `tests/vllm/` tests need (they skip without it).",
    "RLGW_VLLM_CACHE": "Root of that venv (default `~/.cache/rlgw/vllm`).",
    "RLGW_INSTALL_AGENTS": "`1` builds the OpenHands venvs and runs `rlgw run`'s own install in a test.",
    "RLGW_INSTALL_TRAINERS": "`1` builds the verl and SkyRL venvs of `tests/integrations`.",
    "RLGW_REWARD_DIR": "Set by rlgw for a task's verifier: the folder it writes `reward.json` to (the tests'"
    " verifier scripts read it).",
    "RLGW_AGENT_CACHE": "Root of the real agents' venvs (default `~/.cache/rlgw/agents`).",
}


def _scan(paths: list[Path]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for path in paths:
        text = path.read_text(errors="replace")
        for rx in _READS:
            for m in rx.finditer(text):
                found.setdefault(m[1], set()).add(str(path.relative_to(ROOT)))
    return {k: sorted(v) for k, v in found.items()}


def _files(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py")) if IN_SANDBOX not in p.parents]


def _table(found: dict[str, list[str]], meanings: dict[str, str]) -> list[str]:
    missing, stale = set(found) - set(meanings), set(meanings) - set(found)
    if missing or stale:
        raise SystemExit(f"docs/gen/environment.py: undescribed {sorted(missing)}, not read {sorted(stale)}")
    out = ["| variable | read by | meaning |", "| --- | --- | --- |"]
    for name in sorted(found):
        where = ", ".join(f"`{p}`" for p in found[name])
        out.append(f"| `{name}` | {where} | {meanings[name]} |")
    return [*out, ""]


def render() -> str:
    """The environment variables page."""
    settings = [f"`RLGW_{f.name.upper()}`" for f in dataclasses.fields(RlgwSettings)]
    tests = {k: v for k, v in _scan(_files("tests")).items() if k.startswith("RLGW_")}
    return "\n".join(
        [
            "# Environment variables",
            "",
            "Every variable rlgw's code reads, found at build time by scanning the source (the build fails on"
            " one without a meaning here). Flags, where both exist, win.",
            "",
            "## rlgw",
            "",
            *_table(_scan(_files(*PRODUCT_DIRS)), PRODUCT),
            "## Trainer integrations",
            "",
            "The slime, verl and SkyRL adapters read each setting from the trainer's config first, then from"
            f" `RLGW_<NAME>` (`integrations/settings.py`): {', '.join(settings)}.",
            "",
            "## Tests",
            "",
            *_table(tests, TESTS),
        ]
    )


with mkdocs_gen_files.open("reference/environment.md", "w") as f:
    f.write(render())
