"""The trajectories Delta table: scored rows appended exactly once per Kafka offset.

Token and logprob columns are built from the packed buffers by offsets (copied once per column,
`packed_column`), never from per-token Python objects; the record's other fields are
read in one pass per row (`_record_columns`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, WriterProperties

from schemas.packing import concatenated
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


def _offsets(arrays: Sequence[npt.NDArray[np.generic]], value_type: pa.DataType) -> npt.NDArray[np.int64]:
    """The list offsets of `arrays` (one more than rows).

    Raises:
        SinkError: the values overflow a list column's int32 offsets.
    """
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:])
    if offsets[-1] > _MAX_LIST_VALUES:
        raise SinkError(
            f"one batch holds {offsets[-1]} {value_type} values, more than a list column's int32 "
            "offsets allow: lower batch_size"
        )
    return offsets


def list_column(
    arrays: Sequence[npt.NDArray[np.generic]],
    value_type: pa.DataType,
    *,
    nulls: npt.NDArray[np.bool_] | None = None,
) -> pa.ListArray:
    """A list<value_type> column from per-row numpy arrays: one concatenation plus int32 offsets.

    `nulls` marks the rows that are null (their arrays are empty).
    """
    offsets = _offsets(arrays, value_type)
    values = np.concatenate(arrays) if arrays else np.empty(0, dtype=value_type.to_pandas_dtype())
    mask = None if nulls is None or not nulls.any() else pa.array(nulls)
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type), mask=mask
    )


_VALUES = methodcaller("values")
_DTYPE = attrgetter("dtype")


def map_column(maps: Sequence[Mapping[str, object]], value_type: pa.DataType) -> pa.MapArray:
    """A map<string, value_type> column from per-row mappings (none null): keys and values flattened
    once, with int32 offsets. Converting a list of item lists per row costs about four times as much.
    """
    offsets = np.zeros(len(maps) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, maps), dtype=np.int32, count=len(maps)), out=offsets[1:])
    keys = list(chain.from_iterable(maps))
    values = list(chain.from_iterable(map(_VALUES, maps)))
    return pa.MapArray.from_arrays(
        pa.array(offsets), pa.array(keys, pa.string()), pa.array(values, value_type)
    )


POOLED_BYTES = 16 * 2**20
"""From this size on, `packed_column` copies into Arrow's memory pool instead of joining bytes."""


def packed_column(arrays: Sequence[npt.NDArray[np.generic]], value_type: pa.DataType) -> pa.ListArray:
    """`list_column` of arrays already in `value_type`'s little-endian layout (the packed token
    buffers as `validate` views them), copied once, with no per-row numpy call. Other arrays take
    `list_column`.

    A column of POOLED_BYTES or more (a commit's tens of MB) is copied into a buffer of Arrow's
    memory pool (`schemas.packing.concatenated`), which reuses the memory of earlier commits
    without page faults. A smaller one is joined with `b"".join`, which costs less per row where
    the heap is reused anyway.
    """
    dtype = np.dtype(value_type.to_pandas_dtype())
    if arrays and set(map(_DTYPE, arrays)) != {dtype}:
        return list_column(arrays, value_type)
    offsets = _offsets(arrays, value_type)
    if int(offsets[-1]) * dtype.itemsize >= POOLED_BYTES:
        data = concatenated(arrays, dtype)
    else:
        try:
            data = pa.py_buffer(b"".join(arrays))  # type: ignore[arg-type]  # numpy arrays are bytes-like
        except (TypeError, BufferError):  # not contiguous
            return list_column(arrays, value_type)
    values = pa.Array.from_buffers(value_type, int(offsets[-1]), [None, data])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


_NO_MASK = np.zeros(0, dtype=np.bool_)


def loss_mask_column(rows: Sequence[ScoredTrajectory]) -> pa.Array:
    """list<bool> of each row's loss mask (validated 0/1 bytes, viewed as booleans); null without one."""
    masks = [r.tokens.loss_mask for r in rows]
    if all(m is None for m in masks):
        return pa.nulls(len(rows), pa.list_(pa.bool_()))
    nulls = np.fromiter((m is None for m in masks), dtype=np.bool_, count=len(masks))
    return list_column([_NO_MASK if m is None else m.view(np.bool_) for m in masks], pa.bool_(), nulls=nulls)


_RECORD_FIELDS = (
    "trajectory_id",
    "group_id",
    "sample_index",
    "group_size",
    "domain",
    "task_type",
    "policy_version",
    "response_text",
    "finish_reason",
    "worker_id",
    "created_at",
    "metadata",
    "task_id",
    "attempt",
    "version_spans",
    "logprob_mode",
)
"""The record fields a row keeps, in the order `_record_columns` returns them."""
_RECORD_DEFAULTS: dict[str, Any] = {
    "response_text": "",
    "metadata": {},
    "task_id": None,
    "attempt": 0,
    "version_spans": None,
    "logprob_mode": None,
}
"""What a record without the field (one not decoded with the shipped schema) stores."""


def _record_columns(records: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]]:
    """Per field of _RECORD_FIELDS, its values over `records`: one C-level pass over each record
    (itemgetter, then a transpose), with _RECORD_DEFAULTS for a record that lacks a field."""
    get = itemgetter(*_RECORD_FIELDS)
    try:
        rows = list(map(get, records))
    except KeyError:
        rows = [get({**_RECORD_DEFAULTS, **rec}) for rec in records]
    if not rows:
        return [[] for _ in _RECORD_FIELDS]
    return list(zip(*rows, strict=True))


def trajectories_table(
    rows: Sequence[ScoredTrajectory],
    coordinates: Sequence[Coordinates],
    ingested_at: datetime,
    profile_id: str,
) -> pa.Table:
    """Build the Arrow table of `rows`, in TRAJECTORIES_SCHEMA's column order."""
    (
        trajectory_id, group_id, sample_index, group_size, domain, task_type, policy_version,
        response_text, finish_reason, worker_id, created_at, metadata, task_id, attempt,
        version_spans, logprob_mode,
    ) = _record_columns([r.record for r in rows])  # fmt: skip
    verdicts = [r.verdict for r in rows]
    tokens = [r.tokens for r in rows]
    prompt = packed_column([t.prompt_tokens for t in tokens], pa.int32())
    response = packed_column([t.response_tokens for t in tokens], pa.int32())
    lengths = pc.add(pc.list_value_length(prompt), pc.list_value_length(response))
    columns = {
        "trajectory_id": pa.array(trajectory_id, pa.string()),
        "group_id": pa.array(group_id, pa.string()),
        "sample_index": pa.array(sample_index, pa.int32()),
        "group_size": pa.array(group_size, pa.int32()),
        "domain": pa.array(domain, pa.string()),
        "task_type": pa.array(task_type, pa.string()),
        "policy_version": pa.array(policy_version, pa.int64()),
        "prompt_tokens": prompt,
        "response_tokens": response,
        "response_logprobs": packed_column([t.response_logprobs for t in tokens], pa.float32()),
        "response_text": pa.array(response_text, pa.string()),
        "finish_reason": pa.array(finish_reason, pa.string()),
        "worker_id": pa.array(worker_id, pa.string()),
        "created_at": pa.array(created_at, TIMESTAMP),
        "metadata": map_column([m or {} for m in metadata], pa.string()),
        "reward": pa.array([v.reward for v in verdicts], pa.float64()),
        "reward_components": map_column([v.reward_components for v in verdicts], pa.float64()),
        "verifier": pa.array([v.verifier for v in verdicts], pa.string()),
        "verifier_version": pa.array([v.verifier_version for v in verdicts], pa.string()),
        "verifier_status": pa.array([v.status for v in verdicts], pa.string()),
        "domain_reward": pa.array([r.domain_reward for r in rows], pa.float64()),
        "advantage": pa.array([r.advantage for r in rows], pa.float64()),
        "group_status": pa.array([r.group_status for r in rows], pa.string()),
        "length": lengths.cast(pa.int32()),
        "bucket": pa.array([r.bucket for r in rows], pa.string()),
        "profile_id": pa.repeat(pa.scalar(profile_id, pa.string()), len(rows)),
        "ingested_at": pa.repeat(pa.scalar(ingested_at, TIMESTAMP), len(rows)),
        "topic": pa.array([c.topic for c in coordinates], pa.string()),
        "partition": pa.array([c.partition for c in coordinates], pa.int32()),
        "offset": pa.array([c.offset for c in coordinates], pa.int64()),
        "task_id": pa.array(task_id, pa.string()),
        "attempt": pa.array(attempt, pa.int32()),
        "loss_mask": loss_mask_column(rows),
        "version_spans": pa.array(version_spans, pa.list_(VERSION_SPAN)),
        "logprob_mode": pa.array(logprob_mode, pa.string()),
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
