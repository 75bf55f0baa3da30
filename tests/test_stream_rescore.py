"""Re-scoring stored trajectories with another verifier version, old and new side by side."""

from __future__ import annotations

import polars as pl
import pytest

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors.delta_sink import DeltaSink
from stream_processors.offsets import Coordinates
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.rescore import rescore
from stream_processors.verifiers import DomainVerifiers
from tests.stream_support import publish

pytestmark = pytest.mark.timeout(180)


def test_rescore_writes_old_and_new_verdicts_beside_each_other(bootstrap_servers, make_topic, tmp_path):
    topic = make_topic("rescore-raw", partitions=1)
    codec = TrajectoryCodec()
    records = [r for r in SyntheticFleet(seed=3).trajectories(2000) if r["task_type"] == "math"]
    domain = records[0]["domain"]
    records = [r for r in records if r["domain"] == domain][:24]
    # Half the responses write the right answer as a decimal: version 1 (exact text) fails
    # them, version 2.0.0 (numbers) does not.
    for r in records[::2]:
        r["response_text"] = r["response_text"].replace(
            f"\\boxed{{{r['expected_answer']}}}", f"\\boxed{{{r['expected_answer']}.0}}"
        )
    sent = publish(bootstrap_servers, topic, [(None, codec.encode(r)) for r in records])
    messages = [SourceMessage(Coordinates(topic, p, o), None, v) for (p, o), v in sorted(sent.items())]
    lake = tmp_path / "lake"
    verifiers = DomainVerifiers()
    out = BatchProcessor(verifiers=verifiers).process(messages)
    DeltaSink(lake / "trajectories", app_id="rescore-test").write(out.rows, out.coordinates)

    summary = rescore(
        lake_dir=lake,
        domain=domain,
        verifier_version="1",
        verifiers=verifiers,
        bootstrap_servers=bootstrap_servers,
    )
    assert summary["rescored"] == len(records) and summary["source_table_version"] == 0
    table = pl.read_delta(str(lake / "rescores"))
    assert table.height == len(records)
    assert set(table["old_verifier_version"]) == {"2.0.0"} and set(table["new_verifier_version"]) == {"1"}
    decimal_right = {
        r["trajectory_id"] for r in records[::2] if f"{r['expected_answer']}.0}}" in r["response_text"]
    }
    changed = set(table.filter(pl.col("old_reward") != pl.col("new_reward"))["trajectory_id"])
    assert changed == {
        t for t in decimal_right if table.filter(pl.col("trajectory_id") == t)["old_reward"][0] == 1.0
    }
    assert summary["changed"] == len(changed) > 0
