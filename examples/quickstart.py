import asyncio

import openai

from rlgw.gateway.trajectories.client import GatewayClient


async def main() -> None:
    async with GatewayClient("http://127.0.0.1:8000") as gw:
        # Capture owns sampling: the session's values apply, whatever the agent sends.
        sampling = {"temperature": 0.7, "top_p": 0.9}  # unset: the engine's defaults (temperature 1.0)
        s = await gw.create_session("task-42", mode="capture", sampling=sampling)  # or mode="eval"
        agent = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.api_key)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = await agent.chat.completions.create(model="any", messages=messages, max_tokens=64)
        print(reply.choices[0].message.content)
        summary = await gw.finish_session(s.session_id, reward=1.0)  # validated and stored before it returns
        print(summary.trainable_tokens, "trainable tokens in", len(summary.samples), "sample(s)")
        t = await gw.get_trajectory(summary.samples[0].cursor)  # the sample just recorded, by its cursor
        print(t.cursor, t.sample.response_length, int(t.sample.loss_mask.sum()), "trainable tokens")
        # A trainer follows every sample instead: `async for t in gw.trajectories(after=last_cursor_seen)`.


asyncio.run(main())
