"""SkyRL (skyrl-train 0.3.x) GRPO on rlgw capture sessions: SkyRL's own entrypoint with rlgw's generator.

Run like SkyRL's `main_base` (Hydra overrides on the command line), with
`generator.step_wise_trajectories=true` so a run that forked into several segments stays one
trajectory, and `+rlgw.gateway_url=... +rlgw.runner=weather_agent:agent`. The engines are SGLang
servers you start (`generator.run_engines_locally=false`,
`generator.remote_inference_engine_urls=[...]`, SkyRL syncs their weights), with an sglang-router
over the same servers as rlgw serve's `--engine-url`. Not run here (no GPU): the generator itself is
tested on CPU with SkyRL's real classes (tests/integrations/test_skyrl.py).
"""

import hydra
import ray
from omegaconf import DictConfig, OmegaConf
from skyrl_train.entrypoints.main_base import BasePPOExp, config_dir
from skyrl_train.utils import validate_cfg
from skyrl_train.utils.utils import initialize_ray

from rlgw.integrations.skyrl import RlgwGenerator


class RlgwPPOExp(BasePPOExp):
    def get_generator(self, cfg, tokenizer, inference_engine_client):
        settings = OmegaConf.to_container(cfg.rlgw, resolve=True)
        return RlgwGenerator(settings, step_wise=cfg.generator.step_wise_trajectories)


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg: DictConfig):
    RlgwPPOExp(cfg).run()


@hydra.main(config_path=config_dir, config_name="ppo_base_config", version_base=None)
def main(cfg: DictConfig) -> None:
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
