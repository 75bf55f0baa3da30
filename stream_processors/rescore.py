"""Re-scoring: judge stored trajectories of one domain with a chosen verifier version, and write
the new verdicts beside the old ones in the `rescores` table, so users compare before switching.

The trajectories table keeps the lineage (topic, partition, offset) but not the verifier inputs
(expected answer, unit tests, gold fields), so the original messages are read back from Kafka
at those coordinates: re-scoring reaches as far back as the topics' retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable, write_deltalake

from schemas import TrajectoryCodec
from schemas.defaults import StreamDefaults
from schemas.tables import RESCORES_SCHEMA
from stream_processors.exceptions import InvalidRecordError, StreamProcessorError
from stream_processors.offsets import table_uri
from stream_processors.sandbox import SandboxPool
from stream_processors.verifiers import Verifier
from stream_processors.verifiers.domains import DomainVerifiers

RESCORES_TABLE = "rescores"


def fetch_messages(
    bootstrap_servers: str,
    coordinates: list[tuple[str, int, int]],
    timeout_s: float = 30.0,
    *,
    kafka_client: Mapping[str, Any] | None = None,
) -> dict[tuple[str, int, int], bytes]:
    """The values at the given (topic, partition, offset)s, read partition by partition."""
    wanted: dict[tuple[str, int], set[int]] = {}
    for topic, partition, offset in coordinates:
        wanted.setdefault((topic, partition), set()).add(offset)
    consumer = Consumer(
        {
            **(kafka_client or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"rollstream-rescore-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": 67_108_864,
        }
    )
    found: dict[tuple[str, int, int], bytes] = {}
    try:
        for (topic, partition), offsets in wanted.items():
            consumer.assign([TopicPartition(topic, partition, min(offsets))])
            last = max(offsets)
            while True:
                message = consumer.poll(timeout_s)
                if message is None:
                    break
                if message.error() is not None:
                    raise StreamProcessorError(f"reading {topic}[{partition}] failed: {message.error()}")
                offset = message.offset() or 0
                if offset in offsets:
                    found[(topic, partition, offset)] = message.value() or b""
                if offset >= last:
                    break
    finally:
        consumer.close()
    return found


def _stored_rows(source: str, version: int, domain: str, options: dict[str, str] | None) -> pl.DataFrame:
    """The old verdicts and Kafka coordinates of `domain`'s rows at `version`."""
    return (
        pl.read_delta(source, version=version, storage_options=options)
        .filter(pl.col("domain") == domain)
        .select(
            "trajectory_id",
            "reward",
            "verifier_status",
            "verifier",
            "verifier_version",
            "topic",
            "partition",
            "offset",
        )
    )


def _judge(
    verifier: Verifier,
    coords: list[tuple[str, int, int]],
    raw: dict[tuple[str, int, int], bytes],
    pool_size: int,
) -> list[Any]:
    """Each original message's new verdict (or its input error), judged on a sandbox pool."""
    missing = [c for c in coords if c not in raw]
    if missing:
        raise StreamProcessorError(
            f"{len(missing)} of {len(coords)} messages are no longer in Kafka (e.g. {missing[0]}): "
            "re-scoring needs the original messages; rescore within the topics' retention"
        )
    codec = TrajectoryCodec()

    def judge(coord: tuple[str, int, int]) -> Any:
        try:
            return verifier.verify(codec.decode(raw[coord]))
        except InvalidRecordError as exc:
            return exc

    pool = SandboxPool(pool_size)
    try:
        return pool.map(judge, coords)
    finally:
        pool.close()


def _rescores_table(
    rows: pl.DataFrame,
    verdicts: list[Any],
    domain: str,
    verifier: Verifier,
    verifier_version: str,
    version: int,
    rescore_id: str,
) -> pa.Table:
    """The rescores rows: each old verdict beside its new one."""
    now = datetime.now(UTC)
    return pa.Table.from_pylist(
        [
            {
                "trajectory_id": row["trajectory_id"],
                "domain": domain,
                "old_reward": row["reward"],
                "old_status": row["verifier_status"],
                "old_verifier": row["verifier"],
                "old_verifier_version": row["verifier_version"],
                "new_reward": 0.0 if isinstance(v, Exception) else v.reward,
                "new_status": "error" if isinstance(v, Exception) else v.status,
                "new_verifier": verifier.name,
                "new_verifier_version": verifier_version,
                "new_reward_components": []
                if isinstance(v, Exception)
                else list(v.reward_components.items()),
                "source_table_version": version,
                "rescore_id": rescore_id,
                "rescored_at": now,
            }
            for row, v in zip(rows.iter_rows(named=True), verdicts, strict=True)
        ],
        schema=RESCORES_SCHEMA,
    )


def rescore(
    *,
    lake_dir: Path | str,
    domain: str,
    verifier_version: str,
    verifiers: DomainVerifiers,
    bootstrap_servers: str,
    kafka_client: Mapping[str, Any] | None = None,
    table_version: int | None = None,
    pool_size: int = StreamDefaults.sandbox_pool_size,
    progress: Callable[[str], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Judge `domain`'s rows of the trajectories table (at `table_version`) with `verifier_version`.

    Returns a summary: rows rescored, how many changed reward, mean old and new reward, the
    source table version and the rescore id written with every row.
    """
    say = progress or (lambda _: None)
    options = dict(storage_options) if storage_options else None
    source = table_uri(lake_dir, "trajectories")
    version = (
        table_version if table_version is not None else DeltaTable(source, storage_options=options).version()
    )
    verifier = verifiers.build(verifiers.domains[domain], verifier_version)
    rows = _stored_rows(source, version, domain, options)
    say(
        f"rescoring {rows.height} rows of {domain} (table version {version}) with {verifier.name} {verifier_version}"
    )
    coords = [(t, p, o) for t, p, o in rows.select("topic", "partition", "offset").iter_rows()]
    verdicts = _judge(
        verifier, coords, fetch_messages(bootstrap_servers, coords, kafka_client=kafka_client), pool_size
    )
    rescore_id = uuid.uuid4().hex
    table = _rescores_table(rows, verdicts, domain, verifier, verifier_version, version, rescore_id)
    if table.num_rows:
        write_deltalake(table_uri(lake_dir, RESCORES_TABLE), table, mode="append", storage_options=options)
    changed = sum(
        1
        for a, b in zip(table["old_reward"].to_pylist(), table["new_reward"].to_pylist(), strict=True)
        if abs(a - b) > 1e-9
    )
    old = table["old_reward"].to_pylist()
    new = table["new_reward"].to_pylist()
    return {
        "domain": domain,
        "rescored": table.num_rows,
        "changed": changed,
        "mean_old_reward": sum(old) / len(old) if old else None,
        "mean_new_reward": sum(new) / len(new) if new else None,
        "verifier": verifier.name,
        "verifier_version": verifier_version,
        "source_table_version": version,
        "rescore_id": rescore_id,
        "table_uri": table_uri(lake_dir, RESCORES_TABLE),
    }
