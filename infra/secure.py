"""Authenticated Kafka for ``rollstream up --secure``: TLS, SASL/SCRAM users and ACLs per role.

The model (docs/security.md):

- Clients reach the broker only over ``SASL_SSL``: TLS with a certificate signed by a CA that
  ``up --secure`` generates under ``<state_dir>/secure/`` (clients trust ``ca.pem``), and
  SCRAM-SHA-512 passwords, one user per role. The KRaft controller listener stays plaintext on
  loopback and is not for clients.
- Roles, each a Kafka user with the least it needs:
  ``admin`` (super user: provisioning, tools),
  ``producer`` (write the trajectory topics; as a rollout worker or submitter, take and write
  tasks in the task share group, write task dead letters and the outcome log, read the log),
  ``processor`` (read the trajectory topics in its consumer groups, write the dead letters),
  ``operator`` (read the dead letters' and task dead letters' raw bytes, for triage and
  re-scoring, and the task outcome log).
  Only ``processor`` writes and only ``operator`` (and ``admin``) reads ``rollouts.dlq``: raw bytes of
  rejected messages may hold whatever a worker sent, so producers and learners never see them.
- Passwords are random per stack, written to ``credentials.toml`` (mode 0600), and each role's
  client settings to ``<role>.toml``, a config file any ``rollstream`` command takes with
  ``--config``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from infra.exceptions import BrokerError

MECHANISM = "SCRAM-SHA-512"
ROLES = ("admin", "producer", "processor", "operator")
LISTENER = "SASL_SSL"
CERT_DAYS = 825


@dataclass(frozen=True)
class SecurePaths:
    """Files of a secure stack, under ``<state_dir>/secure``."""

    root: Path

    @classmethod
    def of(cls, state_dir: Path) -> SecurePaths:
        return cls(state_dir / "secure")

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def broker_keystore(self) -> Path:
        """The broker's private key and certificate chain, PEM (Kafka's ``ssl.keystore.type=PEM``)."""
        return self.root / "broker.pem"

    @property
    def credentials(self) -> Path:
        return self.root / "credentials.toml"

    def role_config(self, role: str) -> Path:
        return self.root / f"{role}.toml"

    @property
    def enabled(self) -> bool:
        """Whether a secure stack was set up in this state directory."""
        return self.credentials.is_file()


def ensure_material(paths: SecurePaths, host: str) -> dict[str, str]:
    """Create the CA, the broker's certificate and the role passwords once; return the passwords.

    Safe to call again: existing files are kept, so a restarted broker keeps its users.
    """
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    if not (paths.ca_cert.is_file() and paths.ca_key.is_file() and paths.broker_keystore.is_file()):
        _write_certificates(paths, host)
    if not paths.credentials.is_file():
        passwords = {role: secrets.token_urlsafe(24) for role in ROLES}
        body = "".join(f'{role} = "{password}"\n' for role, password in passwords.items())
        _write_private(paths.credentials, "# SCRAM passwords of this stack's Kafka users.\n" + body)
    return load_passwords(paths)


def load_passwords(paths: SecurePaths) -> dict[str, str]:
    """The role passwords of a secure stack.

    Raises:
        BrokerError: the stack was not set up with ``rollstream up --secure``.
    """
    if not paths.credentials.is_file():
        raise BrokerError(f"no secure stack in {paths.root}: run `rollstream up --secure` first")
    with paths.credentials.open("rb") as handle:
        data = tomllib.load(handle)
    missing = [role for role in ROLES if role not in data]
    if missing:
        raise BrokerError(
            f"{paths.credentials} lacks {', '.join(missing)}; delete {paths.root} and run `rollstream up --secure`"
        )
    return {role: str(data[role]) for role in ROLES}


def client_config(paths: SecurePaths, role: str, password: str | None = None) -> dict[str, str]:
    """librdkafka settings that connect as `role` (password read from the stack unless given)."""
    if role not in ROLES and password is None:
        raise BrokerError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    return {
        "security.protocol": LISTENER,
        "sasl.mechanism": MECHANISM,
        "sasl.username": role,
        "sasl.password": password if password is not None else load_passwords(paths)[role],
        "ssl.ca.location": str(paths.ca_cert),
    }


def write_role_configs(paths: SecurePaths, passwords: Mapping[str, str]) -> list[Path]:
    """One ``rollstream.toml``-style file per role, with its ``[kafka_client]`` table."""
    written = []
    for role in ROLES:
        config = client_config(paths, role, passwords[role])
        lines = [
            f"# Connects rollstream commands as Kafka user {role!r}: rollstream --config {paths.role_config(role)} ...",
            "[kafka_client]",
        ]
        lines += [f'"{key}" = "{value}"' for key, value in config.items()]
        _write_private(paths.role_config(role), "\n".join(lines) + "\n")
        written.append(paths.role_config(role))
    return written


def broker_properties(paths: SecurePaths, host: str, port: int, controller: int) -> list[str]:
    """``server.properties`` lines of a node whose clients must authenticate over TLS.

    The node talks to itself and its peers over the same listener as ``admin``.
    """
    admin = load_passwords(paths)["admin"]
    jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="{admin}";'
    return [
        f"listeners={LISTENER}://{host}:{port},CONTROLLER://{host}:{controller}",
        f"advertised.listeners={LISTENER}://{host}:{port}",
        f"inter.broker.listener.name={LISTENER}",
        f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{LISTENER}:{LISTENER}",
        f"sasl.enabled.mechanisms={MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
        f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config={jaas}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={paths.broker_keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={paths.ca_cert}",
        "ssl.client.auth=none",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # admin over SASL_SSL; ANONYMOUS only on the loopback controller listener, which a node's
        # own broker half uses to reach its controller quorum.
        "super.users=User:admin;User:ANONYMOUS",
        "allow.everyone.if.no.acl.found=false",
    ]


def scram_format_arguments(paths: SecurePaths) -> list[str]:
    """``kafka-storage format`` arguments that seed the admin user, so the nodes can log in to each other."""
    admin = load_passwords(paths)["admin"]
    return ["--add-scram", f"{MECHANISM}=[name=admin,password={admin}]"]


def ensure_users_and_acls(
    admin: AdminClient,
    passwords: Mapping[str, str],
    *,
    trajectory_topics: Iterable[str],
    dlq_topic: str,
    group_prefix: str = "rollstream",
    tasks: TaskAcls | None = None,
    timeout: float = 30.0,
) -> None:
    """Create every role's SCRAM user and its ACLs (idempotent: existing ones are replaced alike)."""
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            role, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
        )
        for role, password in passwords.items()
        if role != "admin"
    ]
    for user, future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).items():
        try:
            future.result()
        except Exception as exc:
            raise BrokerError(f"could not create Kafka user {user!r}: {exc}") from exc
    bindings = acl_bindings(
        trajectory_topics=trajectory_topics, dlq_topic=dlq_topic, group_prefix=group_prefix, tasks=tasks
    )
    for binding, future in admin.create_acls(bindings, request_timeout=timeout).items():
        try:
            future.result()
        except Exception as exc:
            raise BrokerError(f"could not create ACL {binding}: {exc}") from exc


@dataclass(frozen=True)
class TaskAcls:
    """The task queue's resources (docs/rollout.md, Tasks), whose ACLs `acl_bindings` adds.

    Attributes:
        topics: the task topics, one per priority class.
        dead_letters: the task dead-letter topic.
        outcomes: the task outcome log.
        group: the rollout workers' share group.
    """

    topics: tuple[str, ...]
    dead_letters: str
    outcomes: str
    group: str


def acl_bindings(
    *, trajectory_topics: Iterable[str], dlq_topic: str, group_prefix: str, tasks: TaskAcls | None = None
) -> list[AclBinding]:
    """The ACLs of the roles in this module's docstring."""
    allow = AclPermissionType.ALLOW
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED

    def rule(
        role: str, kind: ResourceType, name: str, pattern: ResourcePatternType, op: AclOperation
    ) -> AclBinding:
        return AclBinding(kind, name, pattern, f"User:{role}", "*", op, allow)

    out = []
    for name in trajectory_topics:
        out.append(rule("producer", topic, name, literal, AclOperation.WRITE))
        out.append(rule("producer", topic, name, literal, AclOperation.DESCRIBE))
        out.append(rule("processor", topic, name, literal, AclOperation.READ))
        out.append(rule("processor", topic, name, literal, AclOperation.DESCRIBE))
    out.append(rule("processor", topic, dlq_topic, literal, AclOperation.WRITE))
    out.append(rule("processor", topic, dlq_topic, literal, AclOperation.DESCRIBE))
    out.append(rule("processor", group, group_prefix, prefixed, AclOperation.READ))
    out.append(rule("operator", topic, dlq_topic, literal, AclOperation.READ))
    out.append(rule("operator", topic, dlq_topic, literal, AclOperation.DESCRIBE))
    out.append(rule("operator", group, group_prefix, prefixed, AclOperation.READ))
    if tasks is None:
        return out
    # Workers take tasks (READ) and requeue copies (WRITE); submitters WRITE. The share group's
    # configs (lock, delivery limit) are read when a queue opens.
    for name in tasks.topics:
        for op in (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE):
            out.append(rule("producer", topic, name, literal, op))
    for op in (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS):
        out.append(rule("producer", group, tasks.group, literal, op))
    # Task dead letters hold a task's raw bytes: written by workers, read by the operator only.
    out.append(rule("producer", topic, tasks.dead_letters, literal, AclOperation.WRITE))
    out.append(rule("producer", topic, tasks.dead_letters, literal, AclOperation.DESCRIBE))
    out.append(rule("operator", topic, tasks.dead_letters, literal, AclOperation.READ))
    out.append(rule("operator", topic, tasks.dead_letters, literal, AclOperation.DESCRIBE))
    # The outcome log: written by workers, read by `rollstream tasks status` (either role).
    for op in (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE):
        out.append(rule("producer", topic, tasks.outcomes, literal, op))
    out.append(rule("operator", topic, tasks.outcomes, literal, AclOperation.READ))
    out.append(rule("operator", topic, tasks.outcomes, literal, AclOperation.DESCRIBE))
    out.append(rule("producer", group, group_prefix, prefixed, AclOperation.READ))  # status readers
    return out


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _write_certificates(paths: SecurePaths, host: str) -> None:
    """A CA, and the broker's key and certificate (for `host`, localhost and 127.0.0.1) signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollstream local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    broker_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for candidate in {host, "127.0.0.1"}:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(candidate)))
        except ValueError:
            names.append(x509.DNSName(candidate))
    broker_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(broker_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write_private(
        paths.ca_key,
        ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
    )
    paths.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    key = broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_private(
        paths.broker_keystore, (key + broker_cert.public_bytes(pem) + ca_cert.public_bytes(pem)).decode()
    )
