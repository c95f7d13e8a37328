"""Adapters that hand rlgw samples to the trainers teams already run: slime, verl and SkyRL.

`rollout` runs one task through a capture session (an rlgw scaffold, a plain chat loop or the
user's own agent function) and reads back the samples the gateway stored; `slime`, `verl` and
`skyrl` each convert those stored samples into their trainer's types, importing the trainer only
inside themselves, so the base install needs none of them. Nothing here records tokens: the
gateway's ledger is the only recording path.
"""
