"""Why a client could not start: no broker, a TLS refusal, or a refused login.

aiokafka raises the same ``KafkaConnectionError`` whether nothing listens at
the bootstrap address, the TLS handshake fails or the broker refuses the
SASL login. :func:`why_unreachable` asks the network itself, step by step,
as the client would meet them: does the name resolve and does a socket
connect; with TLS, does the handshake succeed with the configured CA and
client certificate; what is left is the broker refusing this client's
login (or a listener of another protocol).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import NamedTuple

from .clients import client_options
from .config import KafkaConfig

__all__ = ["Unreachable", "why_unreachable"]

class Unreachable(NamedTuple):
    """Why a client could not start: ``absent`` when no broker answered at
    all (one may still be starting), else the broker refused this client."""

    reason: str
    absent: bool


#: How long one probe of one address may take.
PROBE_SECONDS = 5.0


async def _connect(host: str, port: int, context: ssl.SSLContext | None) -> str | None:
    """``None`` if a connection (and with ``context`` a TLS handshake) succeeds, else why not."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None),
            PROBE_SECONDS)
    except socket.gaierror:
        return "the name does not resolve"
    except ConnectionRefusedError:
        return "nothing listens there (connection refused)"
    except asyncio.TimeoutError:
        return f"no answer within {PROBE_SECONDS:g} s"
    except ssl.SSLError as error:
        return f"the TLS handshake failed ({error.reason or error})"
    except OSError as error:
        return error.strerror or str(error)
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return None


async def why_unreachable(kafka: KafkaConfig) -> Unreachable:
    """Why ``kafka``'s bootstrap took no client, in one line."""
    addresses = [address.strip() for address in kafka.bootstrap.split(",") if address.strip()]
    refused: list[str] = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            refused.append(f"{address}: not HOST:PORT")
            continue
        reason = await _connect(host.strip("[]"), int(port), None)
        if reason is None and kafka.uses_tls:
            reason = await _connect(host.strip("[]"), int(port), client_options(kafka)["ssl_context"])
            if reason is not None:
                return Unreachable(f"{address} answered but {reason}: check the CA file that signed the broker's "
                                   "certificate (DSH_KAFKA_SSL_CAFILE) and, for mutual TLS, the client certificate "
                                   "and key (DSH_KAFKA_SSL_CERTFILE, DSH_KAFKA_SSL_KEYFILE)", False)
        if reason is None:
            if kafka.sasl_oauth_token is not None:
                return Unreachable(f"the broker at {address} took the connection over {kafka.security_protocol} but "
                                   f"refused the SASL OAUTHBEARER login with {kafka.sasl_oauth_token.describe()}: "
                                   "check that the token is current and meant for this cluster (its audience, "
                                   "issuer and principal)", False)
            if kafka.sasl_mechanism:
                return Unreachable(f"the broker at {address} took the connection over {kafka.security_protocol} but "
                                   f"refused the SASL {kafka.sasl_mechanism} login of user {kafka.sasl_username!r}: "
                                   "check the user name, the password and the mechanism (DSH_KAFKA_SASL_USERNAME, "
                                   "DSH_KAFKA_SASL_PASSWORD[_FILE], DSH_KAFKA_SASL_MECHANISM)", False)
            if kafka.uses_tls and not kafka.ssl_certfile:
                return Unreachable(f"the broker at {address} completed the TLS handshake but then refused this "
                                   "client, which has no certificate: the listener may require one (mutual TLS: "
                                   "DSH_KAFKA_SSL_CERTFILE, DSH_KAFKA_SSL_KEYFILE) or SASL "
                                   "(DSH_KAFKA_SECURITY_PROTOCOL=SASL_SSL)", False)
            return Unreachable(f"the broker at {address} took the connection but not a {kafka.security_protocol} "
                               "client: the listener may want TLS or SASL (DSH_KAFKA_SECURITY_PROTOCOL and the "
                               "DSH_KAFKA_SASL_* and DSH_KAFKA_SSL_* settings)", False)
        refused.append(f"{address}: {reason}")
    return Unreachable("no broker at the bootstrap address (" + "; ".join(refused) + "): check the address, or start "
                       "a local broker with `dsh-pipeline kafka start`", True)
