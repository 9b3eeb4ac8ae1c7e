"""The machine's services as a Lambda container on Docker's default bridge
reaches them, and the environment file that tells the function where they are.

PostgreSQL and Redis listen on 127.0.0.1 (or on a Unix socket, the embedded
servers) and are not ours to reconfigure, so a forwarder per service listens
on the bridge's address; moto (SES) and the server standing in for
CloudFormation's response URL run here and listen there themselves. The
environment is infra/sam-env.json with its compose services' names replaced,
so the file a compose user passes is the one used.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from email.utils import parseaddr
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit, urlunsplit

from ..forward import Forwarder

#: The compose services infra/sam-env.json names, by the role they play.
COMPOSE_SERVICES = ("postgres", "redis", "moto")


@dataclass(frozen=True)
class Addresses:
    """Where a container finds each compose service's stand-in: (host, port)."""

    postgres: tuple[str, int]
    redis: tuple[str, int]
    moto: tuple[str, int]


def database_target(url: str) -> tuple[str, int | None]:
    """(host, port) of a database URL's server, or (socket path, None) for
    pg8000's `unix_sock`."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    sock = parsed.query.get("unix_sock")
    if sock:
        return (sock if isinstance(sock, str) else sock[0]), None
    return parsed.host or "127.0.0.1", parsed.port or 5432


def redis_target(url: str) -> tuple[str, int | None]:
    """(host, port) of a Redis URL's server, or (socket path, None) for unix://."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path, None
    return parts.hostname or "127.0.0.1", parts.port or 6379


def container_database_url(url: str, host: str, port: int) -> str:
    """`url` (its credentials and database) at `host`:`port` over TCP."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    query = {k: v for k, v in parsed.query.items() if k != "unix_sock"}
    return parsed.set(host=host, port=port, query=query).render_as_string(hide_password=False)


def container_redis_url(url: str, host: str, port: int) -> str:
    """`url` (its credentials and database number) at `host`:`port` over TCP."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        db = (parse_qs(parts.query).get("db") or ["0"])[0]
        return f"redis://{host}:{port}/{db}"
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def sam_env(root: Path, addresses: Addresses, database_url: str, redis_url: str) -> dict[str, dict[str, str]]:
    """infra/sam-env.json with each compose service's URL replaced: the
    database's and Redis's own URLs at their forwarders, moto's address."""
    env = json.loads((root / "infra" / "sam-env.json").read_text())
    for values in env.values():
        for key, value in values.items():
            host = urlsplit(value).hostname if "://" in value else None
            if host == "postgres":
                values[key] = container_database_url(database_url, *addresses.postgres)
            elif host == "redis":
                values[key] = container_redis_url(redis_url, *addresses.redis)
            elif host == "moto":
                values[key] = urlunsplit(urlsplit(value)._replace(netloc="%s:%d" % addresses.moto))
    return env


def _aws_client(service: str, endpoint_url: str, region: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=endpoint_url, region_name=region,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _destinations(root: Path) -> tuple[str | None, str | None, str | None]:
    """The queue name, topic ARN and bus infra/sam-env.json gives the SQS, SNS and EventBridge relays."""
    env = json.loads((root / "infra" / "sam-env.json").read_text())
    queue_url = env.get("RelaySqsFunction", {}).get("OUTBOX_SQS_QUEUE_URL")
    return (queue_url.rsplit("/", 1)[1] if queue_url else None,
            env.get("RelaySnsFunction", {}).get("OUTBOX_SNS_TOPIC_ARN"),
            env.get("RelayEventBridgeFunction", {}).get("OUTBOX_EVENTBRIDGE_BUS"))


def _kinesis_stream(root: Path) -> str | None:
    """The stream (by ARN) infra/sam-env.json gives the Kinesis relay."""
    env = json.loads((root / "infra" / "sam-env.json").read_text())
    return env.get("RelayKinesisFunction", {}).get("OUTBOX_KINESIS_STREAM")


def _fifo(name: str) -> dict[str, str]:
    return {"FifoQueue": "true"} if name.endswith(".fifo") else {}


#: What `aws_recorded` reads SNS and EventBridge through: a queue subscribed to the
#: topic, an archive of the bus (moto keeps neither a topic's messages nor a bus's events).
RECORDER = "outbox-local-recorded"


def create_aws_destinations(root: Path, endpoint_url: str, region: str = "us-east-1") -> None:
    """Create in moto at `endpoint_url` the queue, topic and bus infra/sam-env.json gives the
    SQS, SNS and EventBridge relays, so their gates find them (moto starts empty), and what
    records what reaches the topic and the bus (`aws_recorded`). Safe to call twice."""
    queue, topic_arn, bus = _destinations(root)
    sqs = _aws_client("sqs", endpoint_url, region)
    if queue:
        sqs.create_queue(QueueName=queue, Attributes=_fifo(queue))
    if topic_arn:
        name = topic_arn.rsplit(":", 1)[1]
        sns = _aws_client("sns", endpoint_url, region)
        sns.create_topic(Name=name, Attributes={"FifoTopic": "true"} if name.endswith(".fifo") else {})
        recorder = RECORDER + (".fifo" if name.endswith(".fifo") else "")
        url = sqs.create_queue(QueueName=recorder, Attributes=_fifo(recorder))["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)  # the same subscription when it exists
    if bus:
        events = _aws_client("events", endpoint_url, region)
        if bus != "default" and not [b for b in events.list_event_buses(NamePrefix=bus)["EventBuses"]
                                     if b["Name"] == bus]:
            events.create_event_bus(Name=bus)
        if not events.list_archives(NamePrefix=RECORDER)["Archives"]:
            events.create_archive(ArchiveName=RECORDER, EventSourceArn=events.describe_event_bus(Name=bus)["Arn"])
    stream = _kinesis_stream(root)
    if stream:
        kinesis = _aws_client("kinesis", endpoint_url, region)
        name = stream.rsplit("/", 1)[-1]
        if name not in kinesis.list_streams()["StreamNames"]:
            kinesis.create_stream(StreamName=name, ShardCount=1)


def aws_recorded(root: Path, endpoint_url: str, region: str = "us-east-1") -> dict[str, str]:
    """What moto recorded at the SQS, SNS and EventBridge relays' destinations, one
    line per function (the relay's summary says what it sent; this, what arrived)."""
    queue, topic_arn, bus = _destinations(root)
    sqs = _aws_client("sqs", endpoint_url, region)

    def held(name: str) -> int:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        return sum(int(v) for v in counts.values())

    notes = {}
    if queue:
        notes["RelaySqsFunction"] = f"SQS (moto) holds {held(queue)} message(s) in {queue}"
    if topic_arn:
        fifo = ".fifo" if topic_arn.endswith(".fifo") else ""
        notes["RelaySnsFunction"] = (f"SNS (moto) delivered {held(RECORDER + fifo)} message(s) from "
                                     f"{topic_arn.rsplit(':', 1)[1]} to a queue subscribed to it")
    if bus:
        archive = _aws_client("events", endpoint_url, region).describe_archive(ArchiveName=RECORDER)
        notes["RelayEventBridgeFunction"] = f"EventBridge (moto) recorded {archive['EventCount']} event(s) on {bus}"
    stream = _kinesis_stream(root)
    if stream:
        kinesis = _aws_client("kinesis", endpoint_url, region)
        name, held = stream.rsplit("/", 1)[-1], 0
        # By name: moto's shard iterators name their stream, and one got by ARN names none.
        for shard in kinesis.list_shards(StreamName=name)["Shards"]:
            it = kinesis.get_shard_iterator(StreamName=name, ShardId=shard["ShardId"],
                                            ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            held += len(kinesis.get_records(ShardIterator=it, Limit=10000)["Records"])
        notes["RelayKinesisFunction"] = f"Kinesis (moto) holds {held} record(s) in {name}"
    return notes


def ses_sender(root: Path) -> str:
    """The address infra/sam-env.json sends SES email from (moto must have it verified)."""
    env = json.loads((root / "infra" / "sam-env.json").read_text())
    return parseaddr(env["RelaySesFunction"]["OUTBOX_SES_FROM"])[1]


class Bridges:
    """Forwarders on `bridge` to the database's and Redis's servers, moto with
    the sender verified and the SQS, SNS and EventBridge relays' destinations, and a CloudFormation response server (calling
    `on_response` with each answer), for as long as the block lasts. `environment()` is the env-vars file's content."""

    def __init__(self, root: Path, bridge: str, database_url: str, redis_url: str, *,
                 max_send_rate: float = 100.0, on_response: Callable[[Any], None] | None = None) -> None:
        self.root, self.bridge = root, bridge
        self.database_url, self.redis_url = database_url, redis_url
        self.max_send_rate, self.on_response = max_send_rate, on_response
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Bridges":
        from ..cfn_response import ResponseServer
        from ..local_ses import LocalSesServer

        try:
            pg = self._stack.enter_context(Forwarder(self.bridge, *database_target(self.database_url)))
            redis = self._stack.enter_context(Forwarder(self.bridge, *redis_target(self.redis_url)))
            self.ses = self._stack.enter_context(LocalSesServer(host=self.bridge, max_send_rate=self.max_send_rate))
            self.cfn = self._stack.enter_context(ResponseServer(host=self.bridge, on_response=self.on_response))
            self.ses.verify(ses_sender(self.root))
            create_aws_destinations(self.root, self.ses.url, self.ses.region)
        except BaseException:
            self._stack.close()
            raise
        self.addresses = Addresses(postgres=(self.bridge, pg.port), redis=(self.bridge, redis.port),
                                   moto=(self.bridge, self.ses.port))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def environment(self, database_url: str | None = None) -> dict[str, dict[str, str]]:
        """The env-vars file for `sam local`: `database_url` (default: the one
        bridged; another database on the same server is fine) and Redis at
        their forwarders, SES at moto."""
        return sam_env(self.root, self.addresses, database_url or self.database_url, self.redis_url)

    def recorded(self, function: str) -> str | None:
        """What moto recorded at `function`'s destination, one line (None: no AWS relay)."""
        if function == "RelaySesFunction":
            return f"SES (moto) recorded {len(self.ses.sent_messages())} email(s)"
        return aws_recorded(self.root, self.ses.url, self.ses.region).get(function)

    def custom_resource_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """A CloudFormation custom resource request with its ResponseURL at the
        response server (its path kept); any other event as it is."""
        if "RequestType" not in event or "ResponseURL" not in event:
            return event
        path = urlsplit(str(event["ResponseURL"])).path or "/cloudformation-response"
        return {**event, "ResponseURL": self.cfn.url(path)}
