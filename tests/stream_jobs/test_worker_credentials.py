"""The worker (Faust) takes the same STEPLENS_KAFKA_* security settings as every librdkafka
client; `make compose-check` shows one joining its group through the SCRAM listener."""

from __future__ import annotations

import ssl

import faust

from steplens.stream_jobs.worker.app import broker_credentials


def test_plaintext_needs_no_credentials() -> None:
    assert broker_credentials({}) is None
    assert broker_credentials({"security.protocol": "PLAINTEXT"}) is None


def test_scram_over_plaintext() -> None:
    creds = broker_credentials(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "trainer",
            "sasl.password": "pw",
        }
    )
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == (
        "trainer",
        "pw",
        "SCRAM-SHA-512",
    )
    assert creds.ssl_context is None
    assert creds.protocol.value == "SASL_PLAINTEXT"


def test_sasl_over_tls_and_tls_alone() -> None:
    creds = broker_credentials(
        {"security.protocol": "sasl_ssl", "sasl.mechanisms": "PLAIN", "sasl.username": "u"}
    )
    assert isinstance(creds.ssl_context, ssl.SSLContext)
    assert creds.protocol.value == "SASL_SSL"
    assert creds.mechanism.value == "PLAIN"
    tls = broker_credentials({"security.protocol": "SSL"})
    assert isinstance(tls, faust.SSLCredentials)
