"""Runs the OpenHands V1 CLI (`openhands` 1.16) with settings rlgw controls (copied into the sandbox).

What the CLI does not let a command line set, this script sets before handing over to the
CLI's own `main()` (the same `--headless --json -t TASK` run as `openhands`):

- the agent settings file the CLI reads (`$OPENHANDS_PERSISTENCE_DIR/agent_settings.json`):
  without it (or `--override-with-envs`) the CLI ignores `LLM_*`, makes no LLM call and exits
  0. It is the CLI's default agent (`get_default_cli_agent`) with the LLM pointed at the
  endpoint, the run's sampling, and the condenser removed (`--condenser off`: the default
  `LLMSummarizingCondenser` rewrites history) or kept (`default`);
- the turn limit: the CLI builds its `Conversation` with the SDK's default of 500 iterations
  and no setting for it, so `Conversation` is wrapped with `max_iteration_per_run`;
- afterwards, the conversation's own persisted state (`base_state.json`: max_iterations, the
  agent with its condenser, execution_status) is copied to `--state-out`, so the runner
  can verify both settings took effect and read how the run ended.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
from pathlib import Path

# OpenAI sampling names -> the SDK's LLM fields.
_SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_output_tokens",
                    "max_completion_tokens": "max_output_tokens", "seed": "seed"}  # fmt: skip


def write_agent_settings(persist: Path, condenser: str, sampling: dict) -> None:
    """The CLI's default agent, on the endpoint from LLM_*, with our sampling and condenser choice."""
    from openhands.sdk import LLM
    from openhands_cli.locations import AGENT_SETTINGS_PATH
    from openhands_cli.utils import get_default_cli_agent

    extra = {_SAMPLING_FIELDS[k]: v for k, v in sampling.items() if k in _SAMPLING_FIELDS}
    llm = LLM(model=os.environ["LLM_MODEL"], api_key=os.environ["LLM_API_KEY"],
              base_url=os.environ["LLM_BASE_URL"], usage_id="agent", **extra)  # fmt: skip
    agent = get_default_cli_agent(llm)
    if condenser == "off":
        agent = agent.model_copy(update={"condenser": None})
    persist.mkdir(parents=True, exist_ok=True)
    (persist / AGENT_SETTINGS_PATH).write_text(agent.model_dump_json(context={"expose_secrets": True}))


def copy_state(conversations: Path, out: Path) -> None:
    """The newest conversation's `base_state.json` -> `out` (nothing if the run made none)."""
    states = sorted(conversations.glob("*/base_state.json"), key=lambda p: p.stat().st_mtime)
    if states:
        shutil.copy(states[-1], out)


def main() -> int:
    p = argparse.ArgumentParser(description="OpenHands V1 CLI with rlgw's settings")
    p.add_argument("--max-iterations", type=int, required=True)
    p.add_argument("--condenser", choices=("off", "default"), required=True)
    p.add_argument("--sampling", default="{}", help="JSON object of OpenAI sampling parameters")
    p.add_argument("--state-out", required=True, help="where to copy the conversation's base_state.json")
    args, cli_args = p.parse_known_args()
    write_agent_settings(
        Path(os.environ["OPENHANDS_PERSISTENCE_DIR"]), args.condenser, json.loads(args.sampling)
    )

    import openhands_cli.setup as setup
    from openhands_cli.entrypoint import main as cli_main
    from openhands_cli.locations import get_conversations_dir

    setup.Conversation = functools.partial(setup.Conversation, max_iteration_per_run=args.max_iterations)
    sys.argv = ["openhands", *cli_args]
    try:
        cli_main()
        return 0
    finally:
        copy_state(Path(get_conversations_dir()), Path(args.state_out))


if __name__ == "__main__":
    sys.exit(main())
