"""The trainer: trajectory consumer, losses, PyTorch and Megatron-core trainers, and the RL loop.

It reads validated samples from the gateway's trajectory stream and the sample contract
(`rlgw.gateway.sample`), and publishes weights through `rlgw.sync`; it knows nothing about
HTTP routes, chat templates or sandboxes.
"""
