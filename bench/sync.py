"""Weight-sync throughput on a synthetic bf16 model: full write, delta encode/apply, gloo broadcast.

Prints GB/s of model bytes for each path beside the reference the issue names, measured in the same run
and interleaved with it (reference, path, reference, path...: on a shared machine both see the same
load): a single-threaded memcpy for delta encode (goal 0.5x) and apply (goal 0.8x), a plain `cp` of
the same bytes for a full version's write (goal 1.0x: disk speed), and raw torch.distributed gloo for
the broadcast. Best of `--reps` each; run it twice and read the figures as a range. Each line also
gives GB per CPU-second of the path and of its reference: on a machine whose cores others use, the
wall ratio is what the path got and the CPU ratio what it costs.

`--parts` times instead each part of a delta encode and apply alone on one thread (hash, compare,
changed positions, zstd; decode, copy into the new file, patch, hash): the sum of a path's parts
against memcpy bounds the ratio two cores can reach.

    python -m bench.sync                 # 512 MiB model, 1% of elements changed
    python -m bench.sync --mib 1024 --changed 0.05 --workers 2 --skip-broadcast
    python -m bench.sync --mib 256 --parts
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import (
    DELTA_FILE,
    SCAN_BLOCK,
    _SparsePatch,
    apply_delta,
    encode_tensor,
    write_delta_version,
)
from rlgw.sync.fileio import open_output, stream_tensor
from rlgw.sync.full import NamedBytes, write_full_version
from rlgw.sync.stfile import SafetensorsFile

GB = 1e9


def synthetic(mib: int, changed: float, seed: int = 0) -> tuple[list[NamedBytes], list[NamedBytes]]:
    """(base, new): bf16 tensors of 4096x2048 (16 MiB) totalling `mib`, with `changed` of elements bumped."""
    rng = np.random.default_rng(seed)
    rows, cols = 4096, 2048
    base, new = [], []
    for i in range(max(1, mib // 16)):
        # bf16 bit patterns of small normal values: sign, exponent near 0x3c..0x3f, random mantissa.
        b = (rng.integers(0x3C00, 0x3F80, size=rows * cols, dtype=np.uint16)) ^ (
            rng.integers(0, 2, size=rows * cols, dtype=np.uint16) << 15
        )
        n = b.copy()
        pos = rng.choice(b.size, int(b.size * changed), replace=False)
        n[pos] += rng.integers(1, 8, size=pos.size, dtype=np.uint16)  # a few ulps: an optimizer step
        base.append(NamedBytes(f"layers.{i}.w", "BF16", (rows, cols), b.view(np.uint8)))
        new.append(NamedBytes(f"layers.{i}.w", "BF16", (rows, cols), n.view(np.uint8)))
    return base, new


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process and its waited-for children (`cp`), to the microsecond."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, reps: int = 3) -> float:
    """Best wall time of `reps` runs of `fn()` (the machine is shared; best is the least disturbed).

    Also records the CPU seconds of that best run in `timed.cpu`: on a machine whose cores
    other people use, GB per CPU-second says what the code costs, wall GB/s what it got.
    """
    best, best_cpu = float("inf"), 0.0
    for _ in range(reps):
        c0, t0 = _cpu_seconds(), time.perf_counter()
        fn()
        dt, c1 = time.perf_counter() - t0, _cpu_seconds()
        if dt < best:
            best, best_cpu = dt, c1 - c0
    timed.cpu = best_cpu
    return best


def beside(fn, ref, reps: int) -> tuple[float, float, float, float]:
    """(best seconds of `fn`, its CPU seconds, best seconds of `ref`, its CPU seconds), run alternately."""
    best, cpu, ref_best, ref_cpu = float("inf"), 0.0, float("inf"), 0.0
    for _ in range(reps):
        dt = timed(ref, 1)
        if dt < ref_best:
            ref_best, ref_cpu = dt, timed.cpu
        dt = timed(fn, 1)
        if dt < best:
            best, cpu = dt, timed.cpu
    return best, cpu, ref_best, ref_cpu


class Memcpy:
    """A single-threaded memcpy of `nbytes` of warm memory (np.copyto), the delta paths' reference."""

    def __init__(self, nbytes: int) -> None:
        self.a = np.random.default_rng(1).integers(0, 255, size=nbytes, dtype=np.uint8)
        self.b = np.empty_like(self.a)
        np.copyto(self.b, self.a)

    def __call__(self) -> None:
        np.copyto(self.b, self.a)


def limits(nbytes: int) -> dict[str, float]:
    """memcpy and xxh3-128 GB/s on `nbytes` of warm memory."""
    mc = Memcpy(nbytes)
    return {"memcpy": nbytes / timed(mc) / GB, "xxh3-128": nbytes / timed(lambda: ck.digest(mc.a)) / GB}


def line(
    label: str, nbytes: int, run: tuple[float, float, float, float], ref_label: str, goal: float
) -> None:
    """One path's figures: GB/s and the reference's beside it, their ratio and goal, and the same for CPU.

    On a loaded machine wall GB/s is what the path got and the CPU ratio (GB per CPU-second, path
    over reference) what it costs; the wall ratio equals it only when both get whole cores.
    """
    secs, cpu, ref_secs, ref_cpu = run
    gbs, ref = nbytes / secs / GB, nbytes / ref_secs / GB
    per_cpu, ref_per_cpu = nbytes / max(cpu, 1e-9) / GB, nbytes / max(ref_cpu, 1e-9) / GB
    print(
        f"{label:22s} {gbs:5.2f} GB/s  {ref_label} {ref:5.2f} GB/s  ratio {gbs / ref:4.2f}x (goal {goal})  "
        f"| CPU {per_cpu:5.2f} GB/CPU-s, {ref_label.strip()} {ref_per_cpu:5.2f}: {per_cpu / ref_per_cpu:.2f}x"
    )


def full_writes(args: argparse.Namespace, base: list[NamedBytes], work: Path) -> ck.VersionIndex:
    """Time `write_full_version` (fresh files, with and without fsync) beside `cp` of the same bytes."""
    size = sum(t.data.size for t in base)
    index0 = write_full_version(work / "pub", 0, base, durable=False, workers=args.workers)
    src = work / "pub" / ck.version_dirname(0) / "model.safetensors"
    n = iter(range(1, 1 << 30))

    def ours(durable: bool) -> None:
        write_full_version(work / "full", next(n), base, durable=durable, workers=args.workers)
        shutil.rmtree(work / "full")

    def cp(sync: bool) -> None:
        # coreutils cp: copy_file_range into fresh pages, as a full write fills fresh pages.
        subprocess.run(["cp", str(src), str(work / "cp.bin")], check=True)
        if sync:
            subprocess.run(["sync", str(work / "cp.bin")], check=True)
        os.unlink(work / "cp.bin")

    for durable in (False, True):
        run = beside(lambda d=durable: ours(d), lambda d=durable: cp(d), args.reps)
        label = "full write" + (", fsync" if durable else ", no fsync")
        line(label, size, run, "cp" + (" + sync" if durable else "       "), 1.0)
    return index0


def disk_paths(args: argparse.Namespace) -> None:
    base, new = synthetic(args.mib, args.changed)
    size = sum(t.data.size for t in base)
    mc = Memcpy(size)
    work = Path(tempfile.mkdtemp(prefix="rlgw-bench-", dir=args.dir))
    try:
        print(
            f"model: {len(base)} bf16 tensors, {size / 2**20:.0f} MiB, "
            f"{args.changed:.1%} of elements changed, {args.workers} workers"
        )
        index0 = full_writes(args, base, work)
        pairs = [(n, b.data) for n, b in zip(new, base, strict=True)]
        for v, enc in enumerate(("xor", "overwrite"), start=1):
            target = work / "pub" / ck.version_dirname(v)

            def encode(enc: str = enc, v: int = v, target: Path = target) -> None:
                shutil.rmtree(target, ignore_errors=True)
                write_delta_version(
                    work / "pub", v, index0, pairs, enc, level=args.level, durable=False, workers=args.workers
                )

            line(f"{enc} encode", size, beside(encode, mc, args.reps), "memcpy   ", 0.5)
            stored = (target / DELTA_FILE).stat().st_size
            out = work / f"out-{enc}"
            out.mkdir()

            def apply(out: Path = out, target: Path = target) -> None:
                # Steady state: each apply overwrites the files of the previous output, as `pull`
                # recycles the retired local version (fresh pages cost a fault each on this VM).
                apply_delta(work / "pub" / ck.version_dirname(0), target, out, workers=args.workers)

            line(f"{enc} apply", size, beside(apply, mc, args.reps), "memcpy   ", 0.8)
            print(f"{'':22s} on disk {stored / 2**20:.2f} MiB (1/{size / stored:.0f} of the model)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def part_line(label: str, nbytes: int, secs: float, cpu: float, ref_cpu: float) -> None:
    """One part's GB/s, GB per CPU-second, and its CPU cost in memcpys of the same bytes."""
    print(
        f"  {label:44s} {nbytes / secs / GB:6.2f} GB/s  {nbytes / max(cpu, 1e-9) / GB:6.2f} GB/CPU-s  "
        f"= {cpu / ref_cpu:4.2f} memcpy"
    )


def parts(args: argparse.Namespace) -> None:
    """Each part of an xor delta's encode and apply alone, on one thread, over the bench's model."""
    base, new = synthetic(args.mib, args.changed)
    size = sum(t.data.size for t in base)
    mc = Memcpy(size)
    work = Path(tempfile.mkdtemp(prefix="rlgw-bench-", dir=args.dir))
    mask = np.empty(SCAN_BLOCK, dtype=bool)

    def blocks(fn) -> None:
        for n, b in zip(new, base, strict=True):
            for pos in range(0, n.data.size, SCAN_BLOCK):
                end = pos + SCAN_BLOCK
                fn(n.data[pos:end].view(np.uint64), b.data[pos:end].view(np.uint64))

    def compare(nw: np.ndarray, ow: np.ndarray) -> np.ndarray:
        return np.not_equal(nw, ow, out=mask[: nw.size])

    def changed_words(nw: np.ndarray, ow: np.ndarray) -> np.ndarray:
        return np.flatnonzero(compare(nw, ow))

    def changed_elements(nw: np.ndarray, ow: np.ndarray) -> None:
        at = changed_words(nw, ow)
        sub = np.flatnonzero((nw[at] ^ ow[at]).view(np.uint16) != 0)
        (at[sub >> 2] << 2) | (sub & 3)

    digests = [ck.digest(b.data) for b in base]
    payloads = [
        encode_tensor(n, b.data, d, "xor").payload for n, b, d in zip(new, base, digests, strict=True)
    ]
    raw = [zstd.ZstdDecompressor().decompress(p) for p in payloads]
    cctx = zstd.ZstdCompressor(level=args.level, write_content_size=True)
    index0 = write_full_version(work / "pub", 0, base, durable=False)
    pairs = [(n, b.data) for n, b in zip(new, base, strict=True)]
    jobs = list(zip(pairs, digests, strict=True))
    delta = write_delta_version(work / "pub", 1, index0, pairs, "xor", level=args.level, durable=False)
    v0, v1, out_dir = work / "pub" / ck.version_dirname(0), work / "pub" / ck.version_dirname(1), work / "out"
    out_dir.mkdir()
    src = v0 / "model.safetensors"
    fsize = src.stat().st_size
    sf, stored = SafetensorsFile(src), SafetensorsFile(v1 / DELTA_FILE)

    def decode() -> None:
        for name in stored.entries:
            _SparsePatch(stored.raw(name), delta.tensors[name])

    def copy(write: bool, patched: bool = False) -> None:
        """What apply does to every tensor: read, (patch,) hash and (write) it, chunk by chunk."""
        fd = os.open(src, os.O_RDONLY)
        dst = open_output(out_dir / "model.safetensors", fsize) if write else None
        try:
            for name, e in sf.entries.items():
                patch = _SparsePatch(stored.raw(name), delta.tensors[name]) if patched else None
                off = sf.data_start + e.start
                stream_tensor(fd, off, e.nbytes, dst, off, patch)
        finally:
            os.close(fd)
            if dst is not None:
                os.close(dst)

    encode = [
        ("memcpy (np.copyto)", mc),
        ("xxh3-128 of the new bytes", lambda: [ck.digest(n.data) for n in new]),
        ("compare 8-byte words (np.not_equal)", lambda: blocks(compare)),
        ("  + find the changed words (np.flatnonzero)", lambda: blocks(changed_words)),
        ("  + split them into changed elements", lambda: blocks(changed_elements)),
        (f"zstd level {args.level} of the sparse payloads", lambda: [cctx.compress(r) for r in raw]),
        ("encode_tensor (all of it)", lambda: [encode_tensor(*p, d, "xor") for p, d in jobs]),
    ]
    apply = [
        ("decode the sparse payloads (zstd, cumsum)", decode),
        ("pread the base + hash (no write)", lambda: copy(False)),
        ("pread + hash + pwrite the new file", lambda: copy(True)),
        ("pread + decode + patch + hash + pwrite", lambda: copy(True, True)),
        ("apply_delta (all of it)", lambda: apply_delta(v0, v1, out_dir, workers=1)),
    ]
    print(f"parts, one thread: {len(base)} bf16 tensors, {size / 2**20:.0f} MiB, {args.changed:.1%} changed")
    try:
        ref_cpu = 0.0
        for title, rows in (("xor encode", encode), ("xor apply", apply)):
            print(title)
            for label, fn in rows:
                secs = timed(fn, args.reps)
                ref_cpu = ref_cpu or timed.cpu
                part_line(label, size, secs, timed.cpu, ref_cpu)
    finally:
        sf.close()
        stored.close()
        shutil.rmtree(work, ignore_errors=True)


def _broadcast_rank(rank: int, port: int, mib: int, reps: int, bucket: int, out) -> None:
    """One rank of the broadcast comparison: raw per-tensor broadcasts, then rlgw's buckets."""
    import torch

    from rlgw.sync.broadcast import WeightUpdateGroup, make_buckets, receive_bucket, send_bucket

    torch.set_num_threads(1)
    base, _ = synthetic(mib, 0.0)
    named = [(t.name, torch.from_numpy(t.data).view(torch.bfloat16).reshape(t.shape)) for t in base]
    if rank == 1:
        named = [(n, torch.empty_like(t)) for n, t in named]
    group = WeightUpdateGroup("127.0.0.1", port, rank, 2, group_name="bench", timeout_s=300)
    announce = [b.announce() for b in make_buckets(named, bucket)]

    def raw() -> None:
        for _, t in named:
            group.pg.broadcast([t], _root()).wait()

    def ours() -> None:
        if rank == 0:
            for b in make_buckets(named, bucket):
                send_bucket(group, b)
        else:
            group.begin_transfer()  # what the engine does once a transfer is applied
            for a in announce:
                receive_bucket(group, a["names"], a["dtypes"], a["shapes"], a["load_format"] is not None)

    result = {}
    for label, fn in (("raw", raw), ("ours", ours), ("raw2", raw), ("ours2", ours)):
        group.broadcast(torch.zeros(1))  # line both ranks up before timing
        result[label] = timed(fn, reps)
    group.destroy()
    if rank == 0:
        out.put(result)


def _root():
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts


def broadcast_paths(mib: int, reps: int, bucket: int = 256 << 20) -> tuple[float, float]:
    """GB/s of raw gloo per-tensor broadcasts vs rlgw's bucketed sender/receiver, two processes."""
    import multiprocessing as mp
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_broadcast_rank, args=(r, port, mib, reps, bucket, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    result = out.get(timeout=900)
    for p in procs:
        p.join()
    size = (mib // 16) * (16 << 20)
    return size / min(result["raw"], result["raw2"]) / GB, size / min(result["ours"], result["ours2"]) / GB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512, help="model size in MiB (default 512)")
    p.add_argument("--changed", type=float, default=0.01, help="fraction of elements changed (default 0.01)")
    p.add_argument("--workers", type=int, default=2, help="encode/apply threads (default 2)")
    p.add_argument("--level", type=int, default=1, help="zstd level of the deltas (default 1)")
    p.add_argument("--reps", type=int, default=3, help="repetitions; the best is printed (default 3)")
    p.add_argument("--dir", default=None, help="scratch directory (default: the system temp dir)")
    p.add_argument("--skip-broadcast", action="store_true", help="skip the gloo broadcast comparison")
    p.add_argument("--parts", action="store_true", help="time each part of delta encode/apply instead")
    args = p.parse_args()
    if args.parts:
        parts(args)
        return
    lim = limits(args.mib << 20)
    print(f"physical limits here: memcpy {lim['memcpy']:.2f} GB/s, xxh3-128 {lim['xxh3-128']:.2f} GB/s")
    disk_paths(args)
    if not args.skip_broadcast:
        raw, ours = broadcast_paths(args.mib, args.reps)
        print(
            f"gloo broadcast: raw torch.distributed {raw:.2f} GB/s, rlgw sender/receiver {ours:.2f} GB/s "
            f"({ours / raw:.0%} of raw, goal 80%)"
        )


if __name__ == "__main__":
    main()
