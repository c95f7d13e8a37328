"""Weight publication and application: full and delta disk versions, distributed broadcast
(NCCL; gloo on CPU), colocated hand-off, version names and checksums.

It knows nothing about the gateway or the trainer's losses: it moves tensors and proves they
arrived (digests, base versions).
"""
