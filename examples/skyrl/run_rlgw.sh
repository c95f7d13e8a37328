#!/usr/bin/env bash
# SkyRL GRPO on rlgw capture sessions (see main_rlgw.py). Not run here (no GPU).
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
MODEL=${MODEL:-Qwen/Qwen3-4B}
# Your SGLang servers on :30001 and :30002 (SkyRL syncs weights into them), a router over them for rlgw.
python -m sglang_router.launch_router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002 \
    --port 30000 --policy manual &
rlgw serve --engine-url http://127.0.0.1:30000 --port 8000 --data-dir /tmp/rlgw-skyrl &
export PYTHONPATH="$HERE/..:${PYTHONPATH:-}"   # weather_agent.py
python "$HERE/main_rlgw.py" \
    trainer.policy.model.path="$MODEL" trainer.algorithm.advantage_estimator=grpo \
    data.train_data="['$HOME/data/weather/train.parquet']" \
    generator.backend=sglang generator.run_engines_locally=false \
    generator.remote_inference_engine_urls="['127.0.0.1:30001','127.0.0.1:30002']" \
    generator.step_wise_trajectories=true generator.n_samples_per_prompt=8 \
    +rlgw.gateway_url=http://127.0.0.1:8000 +rlgw.runner=weather_agent:agent +rlgw.max_turns=8
