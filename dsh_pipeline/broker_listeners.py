"""How a local broker's listeners take their clients: the lines of its
``server.properties`` that say which listeners it has, which logins, TLS
and authorizer each uses (:class:`ListenerSecurity`).

Without security settings the broker has a plaintext client listener and a
plaintext controller listener, both on loopback. ``sasl_users`` or
``tls_keystore`` add a secured listener beside them; an ``admin`` user
removes every listener that takes a client without credentials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

__all__ = ["ListenerSecurity", "SCRAM"]

#: The SCRAM mechanisms the secured listener offers.
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ListenerSecurity:
    """The secured listener's settings, at :attr:`LocalKafka.secured_bootstrap`.

    ``sasl_users`` (name -> password) take SASL PLAIN and SCRAM-SHA-256/512
    (their SCRAM credentials are written when the folder is formatted);
    ``tls_keystore`` (a PEM file holding the key and its certificate chain)
    makes it TLS. ``authorize``: ACLs decide what its users may do (the
    super user may do anything: the plaintext listener's anonymous user, or
    the ``admin``). ``unsigned_oauth``: it also takes OAUTHBEARER, validating
    tokens with Kafka's unsecured validator (unsigned JWTs: for tests only).
    ``client_ca``: it requires a client certificate signed by this CA
    (mutual TLS).

    ``admin``: the broker's own user, whose password is the first line of
    ``admin_password_file``. With it the broker has no listener that takes a
    client without credentials: the secured listener is its only client
    listener, the controller listener takes SASL too, and the broker's own
    connections (to its controller, between listeners) and readiness checks
    log in as this user (SASL PLAIN), its only super user. ``tls_ca`` is the
    CA those connections trust when the listeners are TLS.
    """

    sasl_users: Mapping[str, str] = field(default_factory=dict)
    tls_keystore: Path | None = None
    authorize: bool = False
    unsigned_oauth: bool = False
    client_ca: Path | None = None
    admin: str | None = None
    admin_password_file: Path | None = None
    tls_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.admin is not None and (self.admin_password_file is None or not self.sasl_users):
            raise ValueError("a broker with an admin user needs its password file and SASL users")

    @property
    def protocol(self) -> str | None:
        """The secured listener's security protocol; None: it has none."""
        if not (self.sasl_users or self.tls_keystore):
            return None
        return {(True, False): "SASL_PLAINTEXT", (False, True): "SSL", (True, True): "SASL_SSL"}[
            (bool(self.sasl_users), self.tls_keystore is not None)]

    def listeners(self, port: int, controller: int, secured_port: int | None) -> list[str]:
        """The listener lines: the client listener on ``port`` (the secured
        one, with an admin), the controller's, and the secured one on
        ``secured_port`` beside a plaintext client listener."""
        control, protocol = f"CONTROLLER://127.0.0.1:{controller}", self.protocol
        if self.admin is not None:  # the secured listener on the client port, and no listener without SASL
            secured = f"SECURED://127.0.0.1:{port}"
            return [f"listeners={secured},{control}", f"advertised.listeners={secured}",
                    f"listener.security.protocol.map=SECURED:{protocol},CONTROLLER:{protocol}",
                    "inter.broker.listener.name=SECURED", "sasl.mechanism.inter.broker.protocol=PLAIN",
                    "sasl.mechanism.controller.protocol=PLAIN", "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
                    f"listener.name.controller.plain.sasl.jaas.config={self._plain_jaas({})}",
                    *self._tls("controller", self.tls_ca), *self._secured_settings()]
        plain = f"PLAINTEXT://127.0.0.1:{port}"
        if secured_port is None or protocol is None:
            return [f"listeners={plain},{control}", f"advertised.listeners={plain}",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT"]
        secured = f"SECURED://127.0.0.1:{secured_port}"
        return [f"listeners={plain},{control},{secured}", f"advertised.listeners={plain},{secured}",
                f"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURED:{protocol}",
                "inter.broker.listener.name=PLAINTEXT", *self._secured_settings()]

    def _plain_jaas(self, users: Mapping[str, str]) -> str:
        """SASL PLAIN's login module: ``users`` (and the admin user, who is
        also the broker's own login)."""
        entries = [f'user_{name}="{password}"' for name, password in users.items()]
        if self.admin is not None:
            assert self.admin_password_file is not None
            password = self.admin_password_file.read_text().splitlines()[0]
            entries = [f'username="{self.admin}"', f'password="{password}"', f'user_{self.admin}="{password}"', *entries]
        return f"org.apache.kafka.common.security.plain.PlainLoginModule required {' '.join(entries)};"

    def _tls(self, listener: str, truststore: Path | None) -> list[str]:
        if self.tls_keystore is None:
            return []
        lines = [f"listener.name.{listener}.ssl.keystore.type=PEM",
                 f"listener.name.{listener}.ssl.keystore.location={self.tls_keystore}"]
        if truststore is not None:
            lines += [f"listener.name.{listener}.ssl.truststore.type=PEM",
                      f"listener.name.{listener}.ssl.truststore.location={truststore}"]
        return lines

    def _secured_settings(self) -> list[str]:
        """The secured listener's logins, TLS and authorizer."""
        lines = []
        if self.sasl_users:
            oauth = ",OAUTHBEARER" if self.unsigned_oauth else ""
            lines += [f"sasl.enabled.mechanisms=PLAIN,{','.join(SCRAM)}{oauth}",
                      f"listener.name.secured.plain.sasl.jaas.config={self._plain_jaas(self.sasl_users)}"]
            lines += [f"listener.name.secured.{mechanism.lower()}.sasl.jaas.config="
                      "org.apache.kafka.common.security.scram.ScramLoginModule required;" for mechanism in SCRAM]
            if self.unsigned_oauth:
                lines += ["listener.name.secured.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security."
                          'oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";']
        lines += self._tls("secured", self.client_ca or self.tls_ca)
        if self.client_ca is not None:
            lines.append("listener.name.secured.ssl.client.auth=required")
        if self.authorize:
            lines += ["authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      f"super.users=User:{self.admin or 'ANONYMOUS'}"]
        return lines

    def admin_settings(self) -> dict[str, str] | None:
        """The ``DSH_KAFKA_*`` settings of the admin user's login, if it has one."""
        if self.admin is None:
            return None
        settings = {"DSH_KAFKA_SECURITY_PROTOCOL": self.protocol or "", "DSH_KAFKA_SASL_MECHANISM": "PLAIN",
                    "DSH_KAFKA_SASL_USERNAME": self.admin, "DSH_KAFKA_SASL_PASSWORD_FILE": str(self.admin_password_file)}
        return settings | ({"DSH_KAFKA_SSL_CAFILE": str(self.tls_ca)} if self.tls_ca is not None else {})
