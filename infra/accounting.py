"""Where a run's messages went: this run's Kafka offsets, matched against both Delta tables.

A run's messages are the offsets a topic grew by while it published (high watermarks read before
and after). Each must be exactly one row in ``trajectories`` or one letter in ``dead_letters``,
found by its (topic, partition, offset): whatever else the topic and tables hold is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from confluent_kafka import Consumer, TopicPartition

from infra.exceptions import DemoError

OffsetRanges = dict[int, tuple[int, int]]
"""partition -> [first offset, end offset) of a run's messages."""


def high_watermarks(
    bootstrap_servers: str, topic: str, *, kafka_client: Mapping[str, Any] | None = None
) -> dict[int, int]:
    """The next offset of every partition of `topic`, which must exist (`rollstream up`)."""
    consumer = Consumer(
        {
            **(kafka_client or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": "rollstream-accounting",
            "enable.auto.commit": False,
        }
    )
    try:
        # Metadata for every topic: naming one in the request would auto-create it if missing.
        found = consumer.list_topics(timeout=15).topics.get(topic)
        if found is None or not found.partitions:
            raise DemoError(
                f"topic {topic!r} is not on {bootstrap_servers}: run `rollstream up` to provision it"
            )
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in found.partitions
        }
    finally:
        consumer.close()


def ranges_between(before: dict[int, int], after: dict[int, int]) -> OffsetRanges:
    """The offsets each partition grew by between two watermark readings."""
    return {p: (before.get(p, 0), high) for p, high in after.items() if high > before.get(p, 0)}


@dataclass(frozen=True)
class Outcome:
    """How a run's messages stand in the lake.

    Attributes:
        expected: messages the run published (the ranges' size).
        rows: trajectories rows at the run's coordinates.
        dead_letters: dead letters at the run's coordinates.
        accounted: distinct coordinates found in either table.
        duplicates: rows or letters beyond one per coordinate, plus repeated trajectory_ids
            among the run's rows.
    """

    expected: int
    rows: int
    dead_letters: int
    accounted: int
    duplicates: int

    @property
    def complete(self) -> bool:
        """Every message is found (it may still be a duplicate)."""
        return self.accounted >= self.expected

    @property
    def exact(self) -> bool:
        """Every message is exactly one row or one dead letter."""
        return self.accounted == self.expected and self.duplicates == 0


def _at(table_uri: str, topic: str, ranges: OffsetRanges, columns: list[str]) -> pl.DataFrame:
    schema = {"partition": pl.Int32, "offset": pl.Int64, "trajectory_id": pl.String}
    if not (Path(table_uri) / "_delta_log").is_dir():
        return pl.DataFrame(schema={c: schema[c] for c in columns})
    within = pl.lit(False)
    for partition, (low, high) in ranges.items():
        within |= (pl.col("partition") == partition) & pl.col("offset").is_between(low, high, closed="left")
    return pl.scan_delta(table_uri).filter((pl.col("topic") == topic) & within).select(columns).collect()


def outcome(lake_dir: Path, topic: str, ranges: OffsetRanges) -> Outcome:
    """Match the run's offsets against <lake>/trajectories and <lake>/dead_letters."""
    rows = _at(str(lake_dir / "trajectories"), topic, ranges, ["partition", "offset", "trajectory_id"])
    letters = _at(str(lake_dir / "dead_letters"), topic, ranges, ["partition", "offset"])
    coordinates = pl.concat([rows.select("partition", "offset"), letters])
    accounted = coordinates.unique().height
    repeated_ids = rows.height - rows["trajectory_id"].n_unique() if rows.height else 0
    return Outcome(
        expected=sum(high - low for low, high in ranges.values()),
        rows=rows.height,
        dead_letters=letters.height,
        accounted=accounted,
        duplicates=coordinates.height - accounted + repeated_ids,
    )
