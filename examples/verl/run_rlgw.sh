#!/usr/bin/env bash
# verl 0.9.x GRPO on rlgw capture sessions. Not run here (no GPU): the agent loop itself is tested
# on CPU with verl's real classes (tests/integrations/test_verl.py).
#
# verl starts its SGLang servers itself and prints their addresses ("LLMServerManager: [...]").
# rlgw drives them through an sglang-router: start the router empty, point rlgw at it, and add each
# printed server to it (POST /workers on the router) before the first rollout.
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
MODEL=${MODEL:-Qwen/Qwen3-4B}
python -m sglang_router.launch_router --port 30000 --policy manual &
rlgw serve --engine-url http://127.0.0.1:30000 --tokenizer "$MODEL" --port 8000 --data-dir /tmp/rlgw-verl &
export PYTHONPATH="$HERE/..:${PYTHONPATH:-}"   # weather_agent.py

# The dataset's rows carry agent_name "rlgw" (or set default_agent_loop below); extra_info.task_id
# names the task, extra_info.rlgw_task carries an rlgw task document for scaffold runners.
python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$HOME/data/weather/train.parquet" data.val_files="$HOME/data/weather/test.parquet" \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.rollout.name=sglang actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops.yaml" \
    actor_rollout_ref.rollout.agent.default_agent_loop=rlgw \
    trainer.use_v1=True trainer.n_gpus_per_node=8 trainer.nnodes=1
