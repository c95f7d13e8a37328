"""How fast the trajectory viewer opens a 32k-token sample in headless Chromium (issue: under 2 s).

Serves the viewer (the real router on a real store, uvicorn in a thread) on one run whose single sample
is a 32k-token tool conversation rendered with tiny-qwen3's tokenizer (650 tool calls and results),
then times, in a fresh browser page each time, navigation -> first tokens drawn (the pane's
`data-loaded` attribute), for the first open (token view computed and cached on the server) and warm
opens. Also prints the server-side time of the run page and of the first token page.

    python bench/viewer.py [--repeats 650] [--opens 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from transformers import AutoTokenizer

from rlgw.gateway.trajectories.store import TrajectoryStore
from rlgw.gateway.viewer.routes import viewer_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import browser
from tests.support.procs import FIXTURES, serve_in_thread
from tests.support.viewer_samples import tool_conversation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=650, help="tool call + result pairs (650: ~35k tokens)")
    ap.add_argument("--opens", type=int, default=5, help="warm opens to time")
    args = ap.parse_args()
    if why := browser.missing():
        raise SystemExit(f"bench/viewer.py: {why}")
    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-qwen3")
    sample = tool_conversation(tok, np.random.default_rng(0), repeats=args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)

        async def fill() -> int:
            store = TrajectoryStore.open(data)
            (cursor,) = await store.add_samples("default", "sess-long", "long-task", [sample])
            await store.close()
            return cursor

        cursor = asyncio.run(fill())
        store = TrajectoryStore.open_readonly(data)
        with serve_in_thread(viewer_app(store, tokenizer=tok)) as url, browser.browser() as b:
            times = []
            for i in range(args.opens + 1):
                page = b.new_page()
                start = time.perf_counter()
                page.goto(f"{url}/ui/runs/{cursor}")
                page.wait_for_selector('.tokens[data-loaded]:not([data-loaded="0"])')
                times.append(time.perf_counter() - start)
                loaded = page.get_attribute(".tokens", "data-loaded")
                page.close()
                if i == 0:
                    turns = args.repeats + 1
                    print(f"sample: {len(sample.tokens)} tokens, {turns} turns; first page {loaded} tokens")
            with httpx.Client(base_url=url) as c:
                t0 = time.perf_counter()
                c.get(f"/ui/runs/{cursor}").raise_for_status()
                t1 = time.perf_counter()
                c.get(f"/ui/api/samples/{cursor}/tokens").raise_for_status()
                t2 = time.perf_counter()
        store.close_sync()
    print(f"first open (token view computed): {times[0]:.2f} s   (limit 2 s: {times[0] / 2:.2f} of it)")
    warm = times[1:]
    print(f"warm opens: median {statistics.median(warm):.2f} s, max {max(warm):.2f} s over {args.opens}")
    print(f"server, warm: run page {1000 * (t1 - t0):.0f} ms, first token page {1000 * (t2 - t1):.0f} ms")


if __name__ == "__main__":
    main()
