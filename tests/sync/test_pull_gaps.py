"""Pull gaps the mutation bench found (`bench/mutation.py`), on real files: staging left behind
that cannot be removed is skipped, never a reason to refuse the pull."""

from __future__ import annotations

from pathlib import Path

from rlgw.sync import checkpoint as ck
from rlgw.sync.pull import pull
from tests.sync.test_pull_edges import chain


def test_stale_staging_that_cannot_be_removed_does_not_stop_a_pull(tmp_path: Path) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    chain(root, 2)
    local.mkdir()
    # Not a directory (rmtree refuses a file and a symlink): it is left where it is.
    (local / ".tmp-weight_v000007-1-2").write_bytes(b"not a staging dir")
    (local / ".tmp-weight_v000008-1-2").symlink_to(root / ck.version_dirname(0))
    r = pull(root, 1, local, durable=False)
    assert r.version == 1 and r.chain == [0, 1]
    assert r.checkpoint_digest == ck.read_index(root / ck.version_dirname(1)).checkpoint_digest
    assert (root / ck.version_dirname(0) / "model.safetensors").exists(), (
        "a symlink's target is never removed"
    )
