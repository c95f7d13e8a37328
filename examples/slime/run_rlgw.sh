#!/usr/bin/env bash
# slime (Megatron + SGLang) training on rlgw capture sessions. Not run here (no GPU): the flags are
# slime's at commit 624b824a (see rlgw/integrations/slime.py); the rlgw side is tested on CPU.
#
# 1. A router that slime's SGLang engines join and rlgw drives (slime skips launching its own when
#    --sglang-router-ip is set). `manual` keeps each session's X-SMG-Routing-Key on one engine.
# 2. rlgw in front of it; its tokenizer comes from the engines' /get_model_info.
# 3. slime, with rlgw's generate function and reward post-process.
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
MODEL=${MODEL:-/root/Qwen3-4B}
ROUTER_PORT=${ROUTER_PORT:-30000}

python -m sglang_router.launch_router --port "$ROUTER_PORT" --policy manual &
rlgw serve --engine-url "http://127.0.0.1:$ROUTER_PORT" --tokenizer "$MODEL" --port 8000 \
    --data-dir /tmp/rlgw-slime &
export PYTHONPATH="$HERE/..:${PYTHONPATH:-}"   # weather_agent.py

python train.py \
    --hf-checkpoint "$MODEL" --ref-load "${MODEL}_torch_dist" \
    --prompt-data "$HERE/prompts.jsonl" --input-key prompt --metadata-key metadata \
    --rollout-batch-size 32 --n-samples-per-prompt 8 --rollout-max-response-len 2048 --rollout-temperature 1 \
    --num-rollout 100 --global-batch-size 256 \
    --advantage-estimator grpo \
    --sglang-router-ip 127.0.0.1 --sglang-router-port "$ROUTER_PORT" \
    --custom-generate-function-path rlgw.integrations.slime.generate \
    --custom-reward-post-process-path rlgw.integrations.slime.reward_post_process \
    --custom-config-path "$HERE/rlgw.yaml"
