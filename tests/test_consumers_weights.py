"""Weights published by version: real Delta tables and files on disk, the real broker, a real MLflow store."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import torch
from confluent_kafka import Producer
from deltalake import DeltaTable
from mlflow.tracking import MlflowClient

from consumers.exceptions import ChecksumError, RegistrationError, VersionConflictError
from consumers.tracking import track_run
from consumers.versioning import PublishOptions, VersionKeeper
from consumers.weights import (
    TXN_APP_ID,
    MlflowRegistration,
    PolicyListener,
    PolicyWatcher,
    announce,
    latest_version,
    listen,
    load_weights,
    publish_version,
    reannounce_latest,
)
from consumers.weights.store import PoliciesTable
from infra.exceptions import ObjectStoreError
from infra.object_store import start_object_store, stop_object_store
from infra.settings import Settings
from infra.topics import TopicSpec, load_topics
from schemas import TrajectoryCodec, UnknownSchemaError
from schemas.exceptions import PolicyVersionError
from schemas.policy_version import POLICY_VERSIONS_TOPIC, PolicyVersion, PolicyVersionCodec

pytestmark = pytest.mark.timeout(120)

# Pinned so that an accidental change of the record (which changes every message header) fails loudly.
POLICY_VERSION_FINGERPRINT = 0xD8C0315F594A3539


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.randn(11, 4, generator=generator)
    return {
        "embedding.weight": embedding,
        "head.weight": embedding,  # tied: the same tensor twice
        "norm.weight": torch.randn(4, generator=generator).to(torch.bfloat16),
        "steps": torch.tensor([seed], dtype=torch.int64),
        "transposed": torch.randn(3, 5, generator=generator).t(),
    }


def _rows(lake: Path) -> list[dict[str, object]]:
    return pl.read_delta(str(lake / "policies")).sort("number").to_dicts()


def _record(number: int = 3) -> PolicyVersion:
    return PolicyVersion(
        number=number,
        step=120,
        path=f"s3://bucket/lake/weights/v{number}/0123456789abcdef.safetensors",
        sha256="ab" * 32,
        size_bytes=4096,
        run_id="0f" * 16,
        table_version=17,
        created_at=datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
    )


def test_versions_round_trip_exactly_and_the_latest_is_the_highest(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert latest_version(str(lake)) is None
    watcher = PolicyWatcher(str(lake))
    assert watcher.latest() is None

    v1 = publish_version(_state(1), lake_uri=str(lake), number=1, step=10, run_id="r", table_version=4)
    assert watcher.latest() == v1
    v2 = publish_version(_state(2), lake_uri=str(lake), number=2, step=20, run_id="r", table_version=9)

    assert watcher.latest() == v2 == latest_version(str(lake))
    assert watcher.get(1) == v1 and watcher.get(7) is None
    assert (v2.number, v2.step, v2.run_id, v2.table_version) == (2, 20, "r", 9)
    data = Path(v2.path).read_bytes()
    assert v2.path == str(lake / "weights" / "v2" / f"{v2.sha256[:16]}.safetensors")
    assert hashlib.sha256(data).hexdigest() == v2.sha256 and len(data) == v2.size_bytes
    for record, seed in ((v1, 1), (v2, 2)):
        loaded = load_weights(record)
        expected = _state(seed)
        assert loaded.keys() == expected.keys()
        for name, tensor in expected.items():
            assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert [row["number"] for row in _rows(lake)] == [1, 2]
    assert DeltaTable(str(lake / "policies")).transaction_version(TXN_APP_ID) == 2


def test_a_number_names_one_set_of_weights(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    publish_version(_state(1), lake_uri=lake, number=1, step=10)
    v2 = publish_version(_state(2), lake_uri=lake, number=2, step=20)
    table_version = DeltaTable(f"{lake}/policies").version()

    for _ in range(4):  # the same tensors serialize to the same bytes every time
        again = publish_version(_state(2), lake_uri=lake, number=2, step=99, run_id="other")
        assert again == v2  # the stored record, created_at and step included
    with pytest.raises(VersionConflictError, match=r"already published .* publish them as version 3"):
        publish_version(_state(3), lake_uri=lake, number=2, step=30)
    with pytest.raises(VersionConflictError, match="not above the latest published version 2"):
        publish_version(_state(3), lake_uri=lake, number=0, step=30)

    assert DeltaTable(f"{lake}/policies").version() == table_version
    assert [row["number"] for row in _rows(tmp_path / "lake")] == [1, 2]
    assert [p.name for p in (tmp_path / "lake" / "weights" / "v2").iterdir()] == [Path(v2.path).name]
    assert publish_version(_state(3), lake_uri=lake, number=3, step=30).number == 3


def test_concurrent_publishers_of_one_number_leave_one_version(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    publish_version(_state(0), lake_uri=lake, number=0, step=0)
    outcomes: list[object] = []
    start = threading.Barrier(2)

    def publish(seed: int) -> None:
        start.wait()
        try:
            outcomes.append(publish_version(_state(seed), lake_uri=lake, number=1, step=seed))
        except VersionConflictError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=publish, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    published = [o for o in outcomes if isinstance(o, PolicyVersion)]
    assert len(published) == 1 and len(outcomes) == 2, outcomes
    assert [row["sha256"] for row in _rows(tmp_path / "lake") if row["number"] == 1] == [published[0].sha256]
    assert [p.name for p in (tmp_path / "lake" / "weights" / "v1").iterdir()] == [
        Path(published[0].path).name
    ]


def test_a_corrupt_or_truncated_file_fails_its_checksum(tmp_path: Path) -> None:
    record = publish_version(_state(1), lake_uri=str(tmp_path / "lake"), number=1, step=1)
    path = Path(record.path)
    original = path.read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(
        ChecksumError, match=f"its record says {record.size_bytes} bytes with sha256 {record.sha256}"
    ):
        load_weights(record)
    path.write_bytes(original[:-8])
    with pytest.raises(ChecksumError, match=f"has {record.size_bytes - 8} bytes"):
        load_weights(record)
    path.write_bytes(original)
    assert torch.equal(load_weights(record)["steps"], torch.tensor([1]))


def test_a_crash_before_the_commit_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = tmp_path / "lake"
    v1 = publish_version(_state(1), lake_uri=str(lake), number=1, step=1)

    class Crash(BaseException):
        pass

    def crash(*_args: object) -> bool:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(PoliciesTable, "append", crash)
        with pytest.raises(Crash):
            publish_version(_state(2), lake_uri=str(lake), number=2, step=2)
    orphans = list((lake / "weights" / "v2").iterdir())
    assert len(orphans) == 1 and orphans[0].stat().st_size > 0  # the file was complete
    assert latest_version(str(lake)) == v1 and PolicyWatcher(str(lake)).get(2) is None

    v2 = publish_version(_state(3), lake_uri=str(lake), number=2, step=2)
    assert latest_version(str(lake)) == v2
    assert torch.equal(load_weights(v2)["steps"], torch.tensor([3]))


class _Steps(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.steps = torch.nn.Parameter(torch.tensor([float(seed)]))


def test_a_keeper_starts_from_the_lake_and_the_checkpoint_in_agreement(tmp_path: Path) -> None:
    """Fresh lake: version 0. A checkpoint that records a version the lake lacks (the learner ended
    between its checkpoint and the publication): published at the checkpoint's step. A lake ahead
    of the checkpoint: its newest weights are loaded."""
    options = PublishOptions(lake_uri=str(tmp_path / "lake"), every=4)
    first = VersionKeeper(options)
    first.start(_Steps(0), step=0, checkpoint_version=None, run_id="r")
    assert first.version == 0 and [(r["number"], r["step"]) for r in _rows(tmp_path / "lake")] == [(0, 0)]

    cut_off = VersionKeeper(options)
    cut_off.start(_Steps(8), step=8, checkpoint_version=1, run_id="r")
    assert cut_off.version == 1
    assert [(r["number"], r["step"]) for r in _rows(tmp_path / "lake")] == [(0, 0), (1, 8)]
    assert torch.equal(load_weights(latest_version(options.lake_uri))["steps"], torch.tensor([8.0]))

    behind = _Steps(4)
    VersionKeeper(options).start(behind, step=4, checkpoint_version=0, run_id="r")
    assert torch.equal(behind.steps.detach(), torch.tensor([8.0]))  # the lake's version 1
    assert len(_rows(tmp_path / "lake")) == 2  # nothing published at start


def test_registration_makes_an_mlflow_model_version_with_its_lineage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    registry = MlflowRegistration(tracking_uri=tracking_uri, model_name="test-policy")
    lake = str(tmp_path / "lake")
    with track_run(
        tracking_uri=tracking_uri, experiment="weights", table_uri=f"{lake}/trajectories", params={}
    ) as run:
        record = publish_version(
            _state(1), lake_uri=lake, number=1, step=50, run_id=run.run_id, table_version=6, registry=registry
        )
        again = publish_version(
            _state(1), lake_uri=lake, number=1, step=50, run_id=run.run_id, table_version=6, registry=registry
        )
    assert again == record

    client = MlflowClient(tracking_uri)
    (version,) = client.search_model_versions("name = 'test-policy'")
    assert version.run_id == run.run_id
    assert version.source == f"runs:/{run.run_id}/policies/v1"
    assert version.tags["rollstream.policy_version"] == "1"
    assert version.tags["rollstream.table_version"] == "6"
    assert version.tags["rollstream.sha256"] == record.sha256
    assert version.tags["rollstream.run_id"] == run.run_id
    logged = client.download_artifacts(run.run_id, f"policies/v1/{Path(record.path).name}", str(tmp_path))
    assert hashlib.sha256(Path(logged).read_bytes()).hexdigest() == record.sha256
    assert not (tmp_path / "mlruns").exists()

    with pytest.raises(RegistrationError, match="needs the learner's run_id"):
        publish_version(_state(2), lake_uri=lake, number=2, step=60, registry=registry)
    assert latest_version(lake) == record


def test_the_codec_round_trips_and_stays_apart_from_trajectories() -> None:
    codec = PolicyVersionCodec()
    record = _record()
    message = codec.encode(record)
    decoded = codec.decode(message)
    assert decoded == record and decoded.created_at.microsecond == 123000
    assert hex(codec.fingerprint) == hex(POLICY_VERSION_FINGERPRINT)
    assert codec.fingerprint not in TrajectoryCodec().known_fingerprints
    with pytest.raises(UnknownSchemaError):
        TrajectoryCodec().decode(message)
    trajectory_header = b"\xc3\x01" + TrajectoryCodec().fingerprint.to_bytes(8, "little")
    with pytest.raises(UnknownSchemaError, match=r"no dev\.rollstream\.PolicyVersion"):
        codec.decode(trajectory_header + b"\x00")
    with pytest.raises(PolicyVersionError, match="64 lowercase hex"):
        PolicyVersion.from_dict({**record.as_dict(), "sha256": "AB" * 32})
    with pytest.raises(PolicyVersionError, match="number = -1"):
        PolicyVersion.from_dict({**record.as_dict(), "number": -1})


def _declared_policies_topic() -> TopicSpec:
    (spec,) = [spec for spec in load_topics(Settings()) if spec.role == "policies"]
    return spec


def test_the_topic_is_declared_compacted() -> None:
    spec = _declared_policies_topic()
    assert spec.name == POLICY_VERSIONS_TOPIC
    assert spec.config["cleanup.policy"] == "compact" and spec.partitions == 1


def test_announcements_reach_the_compacted_topic_and_restart_reannounces(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("policies", config=dict(_declared_policies_topic().config))
    config = {"bootstrap.servers": bootstrap_servers}
    lake = str(tmp_path / "lake")
    assert reannounce_latest(lake, config, topic=topic) is None
    v1 = publish_version(_state(1), lake_uri=lake, number=1, step=1)
    announce(v1, config, topic=topic)
    noise = Producer(config)
    noise.produce(topic, key=b"policy", value=b"not a record")
    noise.produce(topic, key=b"someone-else", value=PolicyVersionCodec().encode(_record(9)))
    assert noise.flush(30) == 0
    v2 = publish_version(_state(2), lake_uri=lake, number=2, step=2)
    announce(v2, config, topic=topic)
    assert reannounce_latest(lake, config, topic=topic) == v2

    with contextlib.closing(listen(config, topic=topic, idle_s=60)) as records:
        assert list(itertools.islice(records, 3)) == [v1, v2, v2]
    numbers: list[int] = []
    with PolicyListener(config, topic=topic, key=None) as listener:
        for _ in range(120):  # the undecodable record is skipped, not raised
            record = listener.poll(0.5)
            numbers += [record.number] if record else []
            if len(numbers) == 4:
                break
    assert numbers == [1, 9, 2, 2]


def test_an_object_store_lake_publishes_and_loads(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    try:
        store = start_object_store(settings, build=False)  # the install step builds MinIO, never a test
    except ObjectStoreError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        lake, options = f"{store.lake_uri}/weights-test", store.storage_options
        v1 = publish_version(_state(1), lake_uri=lake, number=1, step=1, storage_options=options)
        v2 = publish_version(_state(2), lake_uri=lake, number=2, step=2, storage_options=options)
        assert v2.path.startswith(f"{lake}/weights/v2/")
        assert PolicyWatcher(lake, storage_options=options).latest() == v2
        loaded = load_weights(v1, storage_options=options)
        assert all(torch.equal(loaded[name], tensor) for name, tensor in _state(1).items())
        assert publish_version(_state(2), lake_uri=lake, number=2, step=2, storage_options=options) == v2
        with pytest.raises(VersionConflictError):
            publish_version(_state(3), lake_uri=lake, number=2, step=2, storage_options=options)
    finally:
        stop_object_store(settings)
