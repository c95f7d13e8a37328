"""Scripts copied into a sandbox and run there by the agent's own interpreter (the built-in agent and the
launchers of Terminus-2 and OpenHands V1). The runner never imports them: each scaffold reads its
script's source (`IN_SANDBOX / name`) and writes it into the sandbox."""

from pathlib import Path

IN_SANDBOX = Path(__file__).parent
