"""librdkafka security settings (``settings.kafka_client``) in the form Faust's aiokafka driver takes.

rollstream describes a secured cluster once, as librdkafka properties (docs/security.md); the
confluent-kafka clients take them as they are, and Faust gets the equivalent credentials here.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import faust
from faust.types.auth import CredentialsT

_SASL = {"SASL_SSL", "SASL_PLAINTEXT"}
_SUPPORTED_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}


class KafkaSecurityError(ValueError):
    """The Kafka client settings ask for something the stream worker cannot do."""


def faust_credentials(config: Mapping[str, Any]) -> CredentialsT | None:
    """Faust broker credentials equivalent to the librdkafka `config`; None for plaintext.

    Raises:
        KafkaSecurityError: an unsupported protocol or mechanism, or SASL without a user.
    """
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return None
    context = _ssl_context(config) if protocol in {"SSL", "SASL_SSL"} else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if protocol not in _SASL:
        raise KafkaSecurityError(
            f"kafka_client security.protocol {protocol!r} is not one of PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT"
        )
    mechanism = str(config.get("sasl.mechanism", "PLAIN")).upper()
    if mechanism not in _SUPPORTED_MECHANISMS:
        raise KafkaSecurityError(
            f"kafka_client sasl.mechanism {mechanism!r} is not supported by the stream worker; "
            f"use one of {', '.join(sorted(_SUPPORTED_MECHANISMS))}"
        )
    username, password = config.get("sasl.username"), config.get("sasl.password")
    if not username or password is None:
        raise KafkaSecurityError("kafka_client has SASL but no sasl.username / sasl.password")
    return faust.SASLCredentials(
        username=str(username), password=str(password), ssl_context=context, mechanism=mechanism
    )


def _ssl_context(config: Mapping[str, Any]) -> ssl.SSLContext:
    ca = config.get("ssl.ca.location")
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if str(config.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    certificate, key = config.get("ssl.certificate.location"), config.get("ssl.key.location")
    if certificate:
        context.load_cert_chain(str(certificate), str(key) if key else None, config.get("ssl.key.password"))
    return context
