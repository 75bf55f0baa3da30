"""The trajectories Delta table: scored rows appended exactly once per Kafka offset.

Token and logprob columns are built from the packed buffers by offsets (one concatenated numpy
array per column), never from per-token Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from deltalake import ColumnProperties, WriterProperties

from schemas.profile import load_profile
from schemas.tables import TIMESTAMP, TRAJECTORIES_SCHEMA, VERSION_SPAN
from stream_processors.exceptions import SinkError
from stream_processors.offsets import Coordinates, TxnTable
from stream_processors.rows import ScoredTrajectory

_MAX_LIST_VALUES = 2**31 - 1
DICTIONARY_COLUMNS = (
    "domain",
    "task_type",
    "finish_reason",
    "worker_id",
    "verifier",
    "verifier_version",
    "verifier_status",
    "group_status",
    "bucket",
    "profile_id",
    "topic",
    "logprob_mode",
)
"""The low-cardinality string columns, the only ones Parquet dictionary-encodes."""


def writer_properties() -> WriterProperties:
    """ZSTD, and dictionary encoding only for DICTIONARY_COLUMNS.

    Parquet writers try a dictionary first on every column. On token ids, logprobs and ids the
    dictionary overflows and is thrown away, and on the way it more than doubled the write's CPU
    time (140 to 60 us per trajectory measured on fleet messages) and hid the prompt repeats of a
    group from ZSTD (the files are 24% smaller without it).
    """
    return WriterProperties(
        compression="ZSTD",
        default_column_properties=ColumnProperties(dictionary_enabled=False),
        column_properties={name: ColumnProperties(dictionary_enabled=True) for name in DICTIONARY_COLUMNS},
    )


def list_column(
    arrays: Sequence[npt.NDArray[np.generic]],
    value_type: pa.DataType,
    *,
    nulls: npt.NDArray[np.bool_] | None = None,
) -> pa.ListArray:
    """A list<value_type> column from per-row numpy arrays: one concatenation plus int32 offsets.

    `nulls` marks the rows that are null (their arrays are empty).
    """
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_LIST_VALUES:
        raise SinkError(
            f"one batch holds {offsets[-1]} {value_type} values, more than a list column's int32 "
            "offsets allow: lower batch_size"
        )
    values = np.concatenate(arrays) if arrays else np.empty(0, dtype=value_type.to_pandas_dtype())
    mask = None if nulls is None or not nulls.any() else pa.array(nulls)
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type), mask=mask
    )


def map_column(maps: Sequence[Mapping[str, object]], value_type: pa.DataType) -> pa.MapArray:
    """A map<string, value_type> column from per-row mappings (none null): keys and values flattened
    once, with int32 offsets. Converting a list of item lists per row costs about four times as much.
    """
    offsets = np.zeros(len(maps) + 1, dtype=np.int32)
    np.cumsum(np.fromiter((len(m) for m in maps), dtype=np.int32, count=len(maps)), out=offsets[1:])
    keys = [k for m in maps for k in m]
    values = [v for m in maps for v in m.values()]
    return pa.MapArray.from_arrays(
        pa.array(offsets), pa.array(keys, pa.string()), pa.array(values, value_type)
    )


_NO_MASK = np.zeros(0, dtype=np.bool_)


def loss_mask_column(rows: Sequence[ScoredTrajectory]) -> pa.Array:
    """list<bool> of each row's loss mask (validated 0/1 bytes, viewed as booleans); null without one."""
    masks = [r.tokens.loss_mask for r in rows]
    if all(m is None for m in masks):
        return pa.nulls(len(rows), pa.list_(pa.bool_()))
    nulls = np.fromiter((m is None for m in masks), dtype=np.bool_, count=len(masks))
    return list_column([_NO_MASK if m is None else m.view(np.bool_) for m in masks], pa.bool_(), nulls=nulls)


def trajectories_table(
    rows: Sequence[ScoredTrajectory],
    coordinates: Sequence[Coordinates],
    ingested_at: datetime,
    profile_id: str,
) -> pa.Table:
    """Build the Arrow table of `rows`, in TRAJECTORIES_SCHEMA's column order."""
    records = [r.record for r in rows]

    def strings(field: str) -> pa.Array:
        return pa.array([rec[field] for rec in records], pa.string())

    columns = {
        "trajectory_id": strings("trajectory_id"),
        "group_id": strings("group_id"),
        "sample_index": pa.array([rec["sample_index"] for rec in records], pa.int32()),
        "group_size": pa.array([rec["group_size"] for rec in records], pa.int32()),
        "domain": strings("domain"),
        "task_type": strings("task_type"),
        "policy_version": pa.array([rec["policy_version"] for rec in records], pa.int64()),
        "prompt_tokens": list_column([r.tokens.prompt_tokens for r in rows], pa.int32()),
        "response_tokens": list_column([r.tokens.response_tokens for r in rows], pa.int32()),
        "response_logprobs": list_column([r.tokens.response_logprobs for r in rows], pa.float32()),
        "response_text": pa.array([rec.get("response_text", "") for rec in records], pa.string()),
        "finish_reason": strings("finish_reason"),
        "worker_id": strings("worker_id"),
        "created_at": pa.array([rec["created_at"] for rec in records], TIMESTAMP),
        "metadata": map_column([rec.get("metadata") or {} for rec in records], pa.string()),
        "reward": pa.array([r.verdict.reward for r in rows], pa.float64()),
        "reward_components": map_column([r.verdict.reward_components for r in rows], pa.float64()),
        "verifier": pa.array([r.verdict.verifier for r in rows], pa.string()),
        "verifier_version": pa.array([r.verdict.verifier_version for r in rows], pa.string()),
        "verifier_status": pa.array([r.verdict.status for r in rows], pa.string()),
        "domain_reward": pa.array([r.domain_reward for r in rows], pa.float64()),
        "advantage": pa.array([r.advantage for r in rows], pa.float64()),
        "group_status": pa.array([r.group_status for r in rows], pa.string()),
        "length": pa.array([r.length for r in rows], pa.int32()),
        "bucket": pa.array([r.bucket for r in rows], pa.string()),
        "profile_id": pa.repeat(pa.scalar(profile_id, pa.string()), len(rows)),
        "ingested_at": pa.repeat(pa.scalar(ingested_at, TIMESTAMP), len(rows)),
        "topic": pa.array([c.topic for c in coordinates], pa.string()),
        "partition": pa.array([c.partition for c in coordinates], pa.int32()),
        "offset": pa.array([c.offset for c in coordinates], pa.int64()),
        "task_id": pa.array([rec.get("task_id") for rec in records], pa.string()),
        "attempt": pa.array([rec.get("attempt", 0) for rec in records], pa.int32()),
        "loss_mask": loss_mask_column(rows),
        "version_spans": pa.array([rec.get("version_spans") for rec in records], pa.list_(VERSION_SPAN)),
        "logprob_mode": pa.array([rec.get("logprob_mode") for rec in records], pa.string()),
    }
    return pa.Table.from_pydict(columns, schema=TRAJECTORIES_SCHEMA)


class DeltaSink:
    """Appends scored trajectories to <lake>/trajectories, partitioned by bucket, once per offset.

    Args:
        table_uri: where the table lives (created on the first write).
        app_id: names the txn versions that hold the written offsets; keep it stable.
        storage_options: passed through to deltalake for object stores.
        profile_id: the id of the workload profile whose bucket names the rows carry; default
            the shipped profile's.
    """

    def __init__(
        self,
        table_uri: Path | str,
        *,
        app_id: str = "rollstream-processor",
        storage_options: Mapping[str, str] | None = None,
        profile_id: str | None = None,
    ) -> None:
        self.profile_id = profile_id if profile_id is not None else load_profile().id
        self.table = TxnTable(
            str(table_uri),
            app_id=app_id,
            partition_by=["bucket"],
            storage_options=storage_options,
            writer_properties=writer_properties(),
        )

    @property
    def uri(self) -> str:
        """The table's location."""
        return self.table.uri

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest offset of (topic, partition) already written, or None."""
        return self.table.stored_offset(topic, partition)

    def write(self, rows: Sequence[ScoredTrajectory], coordinates: Sequence[Coordinates]) -> int:
        """Append the rows whose offsets are not yet stored; returns how many were written."""
        if len(rows) != len(coordinates):
            raise ValueError(f"rows and coordinates must be parallel, got {len(rows)} and {len(coordinates)}")
        if not rows:
            return 0
        now = datetime.now(UTC)
        return self.table.append(
            coordinates,
            lambda keep: trajectories_table(
                [rows[i] for i in keep], [coordinates[i] for i in keep], now, self.profile_id
            ),
        )
