"""The Parquet form of stored samples: its schema (slime's field names, plus where each sample is
stored) and record batches built column by column from the samples' arrays.

pyarrow is the `parquet` extra: this module imports it only when called. It knows nothing about
files or the command line (`rlgw trajectories export` writes them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from rlgw.gateway.trajectories.store import StoredSample


def schema() -> pa.Schema:
    """The Parquet schema of exported samples: slime's field names, plus where each sample is stored."""
    import pyarrow as pa

    return pa.schema(
        [
            ("tenant", pa.string()),
            ("cursor", pa.int64()),
            ("session_id", pa.string()),
            ("task_id", pa.string()),
            ("segment", pa.int32()),
            ("created_at", pa.float64()),
            ("tokens", pa.list_(pa.int32())),
            ("response_length", pa.int32()),
            ("loss_mask", pa.list_(pa.uint8())),
            ("rollout_log_probs", pa.list_(pa.float32())),
            ("reward", pa.float64()),
            ("status", pa.string()),
            ("rollout_id", pa.string()),
            ("group_index", pa.int32()),
            (
                "weight_versions",
                pa.list_(pa.struct([("version", pa.string()), ("start", pa.int32()), ("end", pa.int32())])),
            ),
            # Free-form per sample, so kept as a JSON string rather than a struct per key.
            ("metadata", pa.string()),
            ("teacher_log_probs", pa.list_(pa.float32())),
            ("teacher_topk_indices", pa.list_(pa.list_(pa.int32()))),
            ("teacher_topk_logprobs", pa.list_(pa.list_(pa.float32()))),
            # MoE: per token (all but the last) its layers x top_k expert ids, layer-major.
            ("rollout_routed_experts", pa.list_(pa.list_(pa.int16()))),
        ]
    )


def _offsets(lengths: list[int] | np.ndarray) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    return pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), pa.int32())


def _list_column(values: list[np.ndarray | None], field_type: pa.DataType) -> pa.Array:
    """A list column from 1-D arrays, or a list-of-lists column from [n, k] arrays (rows become
    inner lists); built from offsets and one flat buffer, never element by element. `None`s
    become nulls."""
    import numpy as np
    import pyarrow as pa

    present = [v for v in values if v is not None]
    mask = pa.array([v is None for v in values]) if len(present) < len(values) else None
    outer = _offsets([0 if v is None else len(v) for v in values])
    inner_type = field_type.value_type
    leaf_type = inner_type.value_type if pa.types.is_list(inner_type) else inner_type
    dtype = leaf_type.to_pandas_dtype()
    leaves = pa.array(
        np.concatenate([np.asarray(v, dtype).ravel() for v in present]) if present else np.empty(0, dtype),
        leaf_type,
    )
    if pa.types.is_list(inner_type):
        rows = np.concatenate([np.full(len(v), v.shape[1]) for v in present]) if present else []
        leaves = pa.ListArray.from_arrays(_offsets(rows), leaves)
    return pa.ListArray.from_arrays(outer, leaves, mask=mask)


def record_batch(batch: list[StoredSample]) -> pa.RecordBatch:
    """Stored samples as one record batch of `schema()`."""
    import orjson
    import pyarrow as pa

    arrow_schema = schema()
    smp = [s.sample for s in batch]
    columns: dict[str, Any] = {
        "tenant": [s.tenant for s in batch],
        "cursor": [s.cursor for s in batch],
        "session_id": [s.session_id for s in batch],
        "task_id": [s.task_id for s in batch],
        "segment": [s.segment for s in batch],
        "created_at": [s.created_at for s in batch],
        "response_length": [x.response_length for x in smp],
        "reward": [x.reward for x in smp],
        "status": [str(x.status) for x in smp],
        "rollout_id": [x.rollout_id for x in smp],
        "group_index": [x.group_index for x in smp],
        "weight_versions": [
            [{"version": w.version, "start": w.start, "end": w.end} for w in x.weight_versions] for x in smp
        ],
        "metadata": [orjson.dumps(x.metadata).decode() for x in smp],
    }
    arrays = []
    for field in arrow_schema:
        if field.name in columns:
            arrays.append(pa.array(columns[field.name], field.type))
        else:
            values = [getattr(x, field.name) for x in smp]
            if field.name == "rollout_routed_experts":  # [tokens, layers, top_k] -> one row per token
                values = [None if v is None else v.reshape(len(v), -1) for v in values]
            arrays.append(_list_column(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
