"""rlgw: an OpenAI-compatible recording gateway for agentic reinforcement learning.

The subpackages are the repository's top-level folders: `rlgw.gateway`, `rlgw.engine`,
`rlgw.sync`, `rlgw.sandboxes`, `rlgw.scaffolds`, `rlgw.trainer`, the trainer adapters in
`rlgw.integrations` and the command line in `rlgw.bin`.
"""

__version__ = "0.1.0"
