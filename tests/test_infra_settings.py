"""Settings fold defaults, a TOML file, ROLLSTREAM_* variables and overrides, in that order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.broker import render_properties
from infra.exceptions import SettingsError
from infra.settings import Settings
from infra.topics import load_topics, max_message_bytes
from schemas.exceptions import RollstreamError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run every test in an empty directory with no ROLLSTREAM_* settings from the caller."""
    for name in list(os.environ):
        if name.startswith("ROLLSTREAM_") and name != "ROLLSTREAM_CACHE":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_are_absolute_and_derived_from_state_dir(tmp_path: Path) -> None:
    settings = Settings.load()
    assert settings.state_dir == tmp_path / ".rollstream"
    assert settings.lake_dir == tmp_path / ".rollstream" / "lake"
    assert settings.tracking_uri == f"sqlite:///{tmp_path}/.rollstream/mlflow.db"
    assert settings.bootstrap_servers == "127.0.0.1:9092"
    assert (settings.controller_port, settings.kafka_version, settings.mlflow_port) == (9093, "4.3.1", 5000)
    assert (settings.raw_topic, settings.ultra_topic, settings.dlq_topic) == (
        "rollouts.raw",
        "rollouts.ultra",
        "rollouts.dlq",
    )
    with pytest.raises(ValidationError, match="frozen"):
        settings.kafka_port = 1  # type: ignore[misc]
    assert settings.lake_uri == str(settings.lake_dir) and settings.lake_is_local
    assert settings.storage_options == {} and settings.kafka_client == {}
    assert settings.replace(brokers=3).bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    moved = settings.replace(state_dir=tmp_path / "elsewhere")
    assert moved.lake_dir == tmp_path / "elsewhere" / "lake"  # derived values follow the change


def test_file_then_env_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "conf"
    config_dir.mkdir()
    config = config_dir / "stack.toml"
    config.write_text(
        '[rollstream]\nkafka_port = 1111\nkafka_heap = "2g"\nstate_dir = "state"\nraw_topic = "file.raw"\n'
        "mlflow_port = 5111\n\n[other_tool]\nignored = true\n"
    )
    monkeypatch.setenv("ROLLSTREAM_KAFKA_PORT", "2222")
    monkeypatch.setenv("ROLLSTREAM_RAW_TOPIC", "env.raw")
    monkeypatch.setenv("ROLLSTREAM_PYTHON", "python3")  # a script's variable, not a setting
    settings = Settings.load(config, kafka_port=3333, raw_topic=None, dlq_topic="override.dlq")
    assert settings.kafka_port == 3333  # override beats env beats file
    assert settings.raw_topic == "env.raw"  # None override is ignored, env beats file
    assert settings.kafka_heap == "2g"  # only the file set it
    assert settings.mlflow_port == 5111
    assert settings.dlq_topic == "override.dlq"
    assert settings.state_dir == config_dir / "state"  # relative to the file, not the cwd
    assert settings.lake_dir == config_dir / "state" / "lake"
    assert settings.tracking_uri == f"sqlite:///{config_dir}/state/mlflow.db"


def test_default_file_top_level_keys_and_bootstrap_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rollstream.toml").write_text('kafka_host = "127.0.0.2"\nlake_dir = "/data/lake"\n')
    monkeypatch.setenv("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.3:19092")
    monkeypatch.setenv("ROLLSTREAM_STATE_DIR", str(tmp_path / "envstate"))
    settings = Settings.load(controller_port=29093)
    assert settings.bootstrap_servers == "127.0.0.3:19092"
    assert settings.lake_dir == Path("/data/lake")  # set explicitly, so it does not follow state_dir
    assert settings.state_dir == tmp_path / "envstate"
    assert settings.tracking_uri == f"sqlite:///{tmp_path}/envstate/mlflow.db"
    assert settings.controller_port == 29093
    assert Settings.load(kafka_port=9999).bootstrap_servers == "127.0.0.3:9999"


def test_unknown_key_in_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "rollstream.toml").write_text("[rollstream]\nkafka_prot = 9092\n")
    with pytest.raises(
        SettingsError, match=r"rollstream.toml: kafka_prot: unknown setting; known settings: state_dir"
    ):
        Settings.load()


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "ROLLSTREAM_KAFKA_PORT",
            "nine",
            r"environment variable ROLLSTREAM_KAFKA_PORT = 'nine': Input should be a valid integer",
        ),
        (
            "ROLLSTREAM_KAFKA__PORT",
            "70000",
            r"ROLLSTREAM_KAFKA__PORT = '70000': Input should be less than or equal to 65535",
        ),
        ("ROLLSTREAM_KAFKA_HEAP", "lots", r"ROLLSTREAM_KAFKA_HEAP = 'lots': String should match pattern"),
        ("ROLLSTREAM_BOOTSTRAP_SERVERS", "a:1,b", r"BOOTSTRAP_SERVERS = 'a:1,b': has 'b', not 'host:port'"),
        (
            "ROLLSTREAM_LAKE_URI",
            "ftp://x/lake",
            r"variable ROLLSTREAM_LAKE_URI = 'ftp://x/lake': has the scheme 'ftp'",
        ),
        ("ROLLSTREAM_KAFKA_CLIENT", "security.protocol=SSL", r"give tables as a JSON object"),
        ("ROLLSTREAM_KAFKA_CLIENT", '{"group.id": "x"}', r"sets group.id, which rollstream manages"),
        (
            "ROLLSTREAM_RAW_TOPIC",
            "bad topic",
            r"ROLLSTREAM_RAW_TOPIC = 'bad topic': is not a valid Kafka topic name",
        ),
        ("ROLLSTREAM_CONTROLLER_PORT", "9092", r"ports must differ"),
    ],
)
def test_bad_environment_values_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError, match=message):
        Settings.load()


def test_bad_overrides_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"override kafka_hots: unknown setting"):
        Settings.load(kafka_hots="127.0.0.1")
    with pytest.raises(SettingsError, match=r"override kafka_port = 'x': Input should be a valid integer"):
        Settings.load(kafka_port="x")
    with pytest.raises(SettingsError, match=r"config file .*nope.toml does not exist"):
        Settings.load(tmp_path / "nope.toml")
    (tmp_path / "rollstream.toml").write_text("kafka_port = [1\n")
    with pytest.raises(RollstreamError, match=r"cannot read config file"):
        Settings.load()


def test_topics_follow_settings_and_size_the_broker() -> None:
    settings = Settings.load(raw_topic="t.raw", ultra_topic="t.ultra", dlq_topic="t.dlq", kafka_port=19092)
    specs = {spec.role: spec for spec in load_topics(settings)}
    assert {role: spec.name for role, spec in specs.items() if role in ("raw", "ultra", "dlq")} == {
        "raw": "t.raw",
        "ultra": "t.ultra",
        "dlq": "t.dlq",
    }
    assert (specs["raw"].partitions, specs["ultra"].partitions, specs["dlq"].partitions) == (4, 4, 1)
    assert specs["raw"].config["retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert specs["dlq"].config["retention.ms"] == str(30 * 24 * 3600 * 1000)
    assert specs["raw"].config["max.message.bytes"] == str(4 * 1024 * 1024)
    assert max_message_bytes(specs.values()) == 64 * 1024 * 1024
    properties = render_properties(settings, specs.values())
    assert "\nmessage.max.bytes=" not in properties  # the broker-wide limit stays Kafka's default
    assert "socket.request.max.bytes=104857600\n" in properties
    assert "listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:9093\n" in properties
    assert "controller.quorum.voters=1@127.0.0.1:9093\n" in properties
    assert f"log.dirs={settings.state_dir}/kafka/data\n" in properties


def test_cluster_fields_from_file_env_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several bootstrap servers, the lake as a URI with storage options, Kafka client passthrough."""
    (tmp_path / "rollstream.toml").write_text(
        "[rollstream]\n"
        'bootstrap_servers = ["k1.example:9092", "k2.example:9092"]\n'
        'lake_uri = "s3://bucket/lake/"\n'
        "[rollstream.storage_options]\n"
        'AWS_ENDPOINT_URL = "http://127.0.0.1:9000"\naws_conditional_put = "etag"\naws_allow_http = true\n'
        "[rollstream.kafka_client]\n"
        '"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n"sasl.password" = "from-file"\n'
    )
    monkeypatch.setenv("ROLLSTREAM_KAFKA_CLIENT", json.dumps({"sasl.username": "env-user"}))
    settings = Settings.load(kafka_client={"sasl.password": "from-flag"})
    assert settings.bootstrap_servers == "k1.example:9092,k2.example:9092"
    assert settings.kafka_port == 9092 and settings.kafka_host == "127.0.0.1"  # the local broker is untouched
    assert not settings.lake_is_local
    assert settings.lake_table_uri("trajectories") == "s3://bucket/lake/trajectories"
    assert settings.delta_storage_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "aws_conditional_put": "etag",
        "aws_allow_http": "true",
    }
    assert dict(settings.kafka_client) == {  # tables merge key by key; the flag beats the file
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.password": "from-flag",
        "sasl.username": "env-user",
    }
    assert settings.kafka_config({"group.id": "g"}) == {
        "bootstrap.servers": "k1.example:9092,k2.example:9092",
        **settings.kafka_client,
        "group.id": "g",
    }
    assert "from-flag" not in repr(settings)  # secrets stay out of logs
    with pytest.raises(SettingsError, match=r"lake_uri = 's3://bucket/lake' is an object store"):
        _ = settings.lake_dir
    again = Settings.load()  # a child process sees the same values through as_env()
    for name, value in settings.as_env().items():
        monkeypatch.setenv(name, value)
    child = Settings.load()
    assert child == settings != again
    monkeypatch.setenv("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.5:19092")  # one address beats the file's list
    monkeypatch.delenv("ROLLSTREAM_KAFKA__HOST")
    monkeypatch.delenv("ROLLSTREAM_KAFKA__PORT")
    monkeypatch.delenv("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS")
    assert Settings.load().bootstrap_servers == "127.0.0.5:19092"


def test_lake_dir_is_an_alias_of_lake_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "a.toml").write_text('lake_dir = "lake"\n')
    assert Settings.load(conf / "a.toml").lake_uri == str(conf / "lake")  # relative to the file
    monkeypatch.setenv("ROLLSTREAM_LAKE_DIR", "/env/lake")
    assert Settings.load().lake_dir == Path("/env/lake")
    assert Settings.load(lake_uri="file:///x/lake").lake_uri == "/x/lake"
    with pytest.raises(SettingsError, match=r"both lake_dir and lake_uri are set"):
        Settings.load(lake_dir="/a", lake_uri="/b")
    assert Settings(bootstrap_servers="h:1", kafka_port=2).kafka_port == 1  # the address wins in its layer


def test_one_address_wins_over_the_port_in_the_same_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child process told another broker by address, beside an inherited port, talks to that broker."""
    monkeypatch.setenv("ROLLSTREAM_KAFKA_PORT", "39092")
    monkeypatch.setenv("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:39700")
    settings = Settings.load()
    assert (settings.bootstrap_servers, settings.kafka_port) == ("127.0.0.1:39700", 39700)
