"""Trainer side of disk sync: publish each new policy as a full or delta version.

`WeightPublisher` keeps a host copy of the last published state (the baseline), so a delta is always
computed against bytes that were actually published and whose digests the index records; seeding it
from a checkpoint verifies that checkpoint first (a bad baseline would poison every later diff).
Every `full_every`-th version is written full, so a new or lost engine host never replays a long
chain, and retention runs after each publish. Engines and transport are not this module's concern.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import ENCODINGS, write_delta_version
from rlgw.sync.errors import VersionError
from rlgw.sync.fileio import Progress
from rlgw.sync.full import NamedBytes, verify_version, write_full_version
from rlgw.sync.stfile import SafetensorsFile
from rlgw.sync.tensors import named_bytes

log = logging.getLogger(__name__)


class WeightPublisher:
    """Publishes versions under `root`; deltas against the last published state.

    Trade-off: the baseline costs one host copy of the model; in return encode never re-reads the
    previous version from disk and its base digests are known without hashing.
    """

    def __init__(
        self,
        root: Path,
        *,
        encoding: str = "xor",
        full_every: int = 10,
        keep_full: int = 2,
        aux_src: Path | None = None,
        durable: bool = True,
        workers: int | None = None,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}")
        self.root, self.encoding, self.full_every, self.keep_full = root, encoding, full_every, keep_full
        self.aux_src, self.durable, self.workers = aux_src, durable, workers
        self.index: ck.VersionIndex | None = None  # describes the baseline
        self.last_full: int | None = None
        self._baseline: dict[str, np.ndarray] = {}

    def seed(self, version_dir: Path) -> ck.VersionIndex:
        """Adopt a published full version as the baseline, after verifying every digest."""
        index = verify_version(version_dir, self.workers)
        baseline = {}
        for fname in sorted({r.file for r in index.tensors.values()}):
            with SafetensorsFile(version_dir / fname) as sf:
                for name in sf.entries:
                    baseline[name] = np.frombuffer(sf.raw(name), dtype=np.uint8).copy()
        self._baseline, self.index, self.last_full = baseline, index, index.version
        if self.aux_src is None:
            self.aux_src = version_dir
        return index

    def publish(
        self,
        state: Iterable[tuple[str, torch.Tensor]],
        version: int,
        kind: str = "auto",
        progress: Progress | None = None,
    ) -> ck.VersionIndex:
        """Publish `state` as `version` (`kind`: auto, full or delta); returns the new index.

        `progress(nbytes)` is called as tensors complete.
        """
        tensors = named_bytes(state)
        if self.index is not None and version <= self.index.version:
            raise VersionError(f"v{version} is not newer than the last published v{self.index.version}")
        if kind == "auto":
            due = self.last_full is None or version - self.last_full >= self.full_every
            kind = "full" if due or self.index is None else "delta"
        t0 = time.perf_counter()
        if kind == "full":
            index = write_full_version(
                self.root,
                version,
                tensors,
                aux_src=self.aux_src,
                durable=self.durable,
                workers=self.workers,
                progress=progress,
            )
            self.last_full = version
        elif kind == "delta":
            if self.index is None:
                raise VersionError("no baseline: publish a full version (or seed) before a delta")
            pairs = [(t, self._baseline_of(t)) for t in tensors]
            index = write_delta_version(
                self.root,
                version,
                self.index,
                pairs,
                self.encoding,
                durable=self.durable,
                workers=self.workers,
                progress=progress,
            )
        else:
            raise ValueError(f"kind must be auto, full or delta, not {kind!r}")
        self._adopt(tensors)
        self.index = index
        removed = ck.gc_versions(self.root, self.keep_full)
        log.info(
            "published weights",
            extra={
                "fields": {
                    "version": version,
                    "kind": kind,
                    "seconds": round(time.perf_counter() - t0, 3),
                    "removed": [p.name for p in removed],
                }
            },
        )
        return index

    def _baseline_of(self, t: NamedBytes) -> np.ndarray:
        old = self._baseline.get(t.name)
        if old is None:
            raise VersionError(f"tensor {t.name!r} is not in the baseline")
        return old

    def _adopt(self, tensors: list[NamedBytes]) -> None:
        for t in tensors:
            old = self._baseline.get(t.name)
            if old is not None and old.size == t.data.size:
                np.copyto(old, t.data)
            else:
                self._baseline[t.name] = t.data.copy()
        for name in set(self._baseline) - {t.name for t in tensors}:
            del self._baseline[name]
