"""The SQS, SNS and EventBridge settings: a bad value stops start-up with one line
naming the variable; good ones are read."""

import pytest

from outbox_relay.config import load_settings
from outbox_relay.errors import ConfigurationError

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
TOPIC = "arn:aws:sns:eu-west-1:123456789012:orders"


@pytest.fixture
def env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "DATABASE_", "REDIS_", "AWS_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", "postgresql+pg8000://u@h/db")
    return monkeypatch


@pytest.mark.parametrize(
    ("settings", "variable", "fragment"),
    [
        ({"OUTBOX_CHANNEL": "sqs"}, "OUTBOX_SQS_QUEUE_URL", "set the queue's URL"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": "orders"}, "OUTBOX_SQS_QUEUE_URL", "must be a queue URL"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": "ftp://sqs.eu-west-1.amazonaws.com/123456789012/q"},
         "OUTBOX_SQS_QUEUE_URL", "must be a queue URL"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": QUEUE + "/extra"}, "OUTBOX_SQS_QUEUE_URL",
         "must be a queue URL"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": QUEUE.replace("orders", "has space")},
         "OUTBOX_SQS_QUEUE_URL", "must be a queue URL"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": QUEUE, "OUTBOX_SQS_MAX_CONCURRENCY": "0"},
         "OUTBOX_SQS_MAX_CONCURRENCY", "greater than or equal to 1"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": QUEUE, "OUTBOX_SQS_MAX_CONCURRENCY": "33"},
         "OUTBOX_SQS_MAX_CONCURRENCY", "less than or equal to 32"),
        ({"OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": QUEUE, "OUTBOX_SQS_MAX_CONCURRENCY": "many"},
         "OUTBOX_SQS_MAX_CONCURRENCY", "valid integer"),
        ({"OUTBOX_CHANNEL": "sns"}, "OUTBOX_SNS_TOPIC_ARN", "set the topic's ARN"),
        ({"OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": "orders"}, "OUTBOX_SNS_TOPIC_ARN", "must be a topic ARN"),
        ({"OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": "arn:aws:sqs:eu-west-1:123456789012:orders"},
         "OUTBOX_SNS_TOPIC_ARN", "must be a topic ARN"),
        ({"OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": "arn:aws:sns:eu-west-1:12345:orders"},
         "OUTBOX_SNS_TOPIC_ARN", "must be a topic ARN"),
        ({"OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": TOPIC, "OUTBOX_SNS_MAX_CONCURRENCY": "0"},
         "OUTBOX_SNS_MAX_CONCURRENCY", "greater than or equal to 1"),
        ({"OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": TOPIC, "OUTBOX_SNS_MAX_CONCURRENCY": "1.5"},
         "OUTBOX_SNS_MAX_CONCURRENCY", "valid integer"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_BUS": "my bus"}, "OUTBOX_EVENTBRIDGE_BUS",
         "event bus name"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_BUS": "b" * 257}, "OUTBOX_EVENTBRIDGE_BUS",
         "event bus name"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_SOURCE": "aws.shop"}, "OUTBOX_EVENTBRIDGE_SOURCE",
         "aws."),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_SOURCE": "shop "}, "OUTBOX_EVENTBRIDGE_SOURCE",
         "blanks"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_SOURCE": "s" * 257}, "OUTBOX_EVENTBRIDGE_SOURCE",
         "at most 256"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY": "0"},
         "OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY", "greater than or equal to 1"),
        ({"OUTBOX_CHANNEL": "eventbridge", "OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY": "64"},
         "OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY", "less than or equal to 32"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_value_is_one_line_naming_the_variable(env, settings, variable, fragment):
    for k, v in settings.items():
        env.setenv(k, v)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == variable
    text = str(info.value)
    assert text.startswith(f"{variable}: ") and fragment in text and "\n" not in text, text


def test_good_values_are_read(env):
    env.setenv("OUTBOX_SQS_QUEUE_URL", QUEUE + ".fifo")
    env.setenv("OUTBOX_SQS_MAX_CONCURRENCY", "8")
    env.setenv("OUTBOX_SNS_TOPIC_ARN", TOPIC + ".fifo")
    env.setenv("OUTBOX_EVENTBRIDGE_BUS", "arn:aws:events:eu-west-1:123456789012:event-bus/shop")
    env.setenv("OUTBOX_EVENTBRIDGE_SOURCE", "shop.orders")
    env.setenv("OUTBOX_CHANNEL", "sqs")
    s = load_settings()
    assert (s.sqs_queue_url, s.sqs_max_concurrency) == (QUEUE + ".fifo", 8)
    env.setenv("OUTBOX_CHANNEL", "sns")
    assert load_settings().sns_topic_arn == TOPIC + ".fifo"
    env.setenv("OUTBOX_CHANNEL", "eventbridge")
    s = load_settings()
    assert s.eventbridge_bus.endswith("event-bus/shop") and s.eventbridge_source == "shop.orders"


@pytest.mark.parametrize(("channel", "other", "value"), [
    ("sns", "OUTBOX_SQS_QUEUE_URL", "orders"),
    ("sqs", "OUTBOX_EVENTBRIDGE_BUS", "my bus"),
    ("redis", "OUTBOX_SES_FROM", "not an address"),
])
def test_a_function_reads_its_own_channels_variables_and_another_channels_are_known_but_not_read(
        env, channel, other, value):
    # Given a relay of one channel, and a variable of another (the template's Globals may set it)
    needs = {"sqs": ("OUTBOX_SQS_QUEUE_URL", QUEUE), "sns": ("OUTBOX_SNS_TOPIC_ARN", TOPIC),
             "redis": ("REDIS_URL", "redis://127.0.0.1:6379/0")}
    env.setenv("OUTBOX_CHANNEL", channel)
    env.setenv(*needs[channel])
    env.setenv(other, value)
    # When its settings load
    s = load_settings()
    # Then the other channel's variable is no misspelling, and its settings are not its function's
    field = other.removeprefix("OUTBOX_").lower()
    assert s.channel.value == channel and field not in type(s).model_fields


def test_eventbridge_needs_no_variable_of_its_own(env):
    env.setenv("OUTBOX_CHANNEL", "eventbridge")
    s = load_settings()
    assert (s.eventbridge_bus, s.eventbridge_source, s.eventbridge_max_concurrency) == ("default", "outbox.relay", 4)


def test_a_local_endpoints_queue_url_is_accepted(env):
    env.setenv("OUTBOX_CHANNEL", "sqs")
    env.setenv("OUTBOX_SQS_QUEUE_URL", "http://127.0.0.1:5000/123456789012/orders")
    assert load_settings().sqs_queue_url.endswith("/orders")


@pytest.mark.parametrize(("channel", "build", "variables"), [
    ("sqs", "outbox_relay.publishers.sqs.publisher:build_sqs_publisher", {"OUTBOX_SQS_QUEUE_URL": QUEUE}),
    ("sns", "outbox_relay.publishers.sns.publisher:build_sns_publisher", {"OUTBOX_SNS_TOPIC_ARN": TOPIC}),
    ("eventbridge", "outbox_relay.publishers.eventbridge.publisher:build_eventbridge_publisher", {}),
])
def test_a_margin_below_four_seconds_is_refused_naming_it(env, channel, build, variables):
    import importlib

    env.setenv("OUTBOX_CHANNEL", channel)
    env.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "3")
    for k, v in variables.items():
        env.setenv(k, v)
    module, name = build.split(":")
    with pytest.raises(ConfigurationError) as info:
        getattr(importlib.import_module(module), name)(load_settings(), client=object())
    assert info.value.variable == "OUTBOX_DEADLINE_MARGIN_SECONDS" and "at least 4s" in str(info.value)


@pytest.mark.parametrize(("variable", "value", "ok"), [
    # Names count ".fifo" within their limit: 80 characters for a queue, 256 for a topic.
    ("OUTBOX_SQS_QUEUE_URL", QUEUE.rsplit("/", 1)[0] + "/" + "q" * 80, True),
    ("OUTBOX_SQS_QUEUE_URL", QUEUE.rsplit("/", 1)[0] + "/" + "q" * 81, False),
    ("OUTBOX_SQS_QUEUE_URL", QUEUE.rsplit("/", 1)[0] + "/" + "q" * 75 + ".fifo", True),
    ("OUTBOX_SQS_QUEUE_URL", QUEUE.rsplit("/", 1)[0] + "/" + "q" * 76 + ".fifo", False),
    ("OUTBOX_SNS_TOPIC_ARN", TOPIC.rsplit(":", 1)[0] + ":" + "t" * 256, True),
    ("OUTBOX_SNS_TOPIC_ARN", TOPIC.rsplit(":", 1)[0] + ":" + "t" * 251 + ".fifo", True),
    ("OUTBOX_SNS_TOPIC_ARN", TOPIC.rsplit(":", 1)[0] + ":" + "t" * 252 + ".fifo", False),
])
def test_queue_and_topic_names_are_held_to_their_services_lengths(env, variable, value, ok):
    env.setenv("OUTBOX_CHANNEL", "sqs" if "SQS" in variable else "sns")
    env.setenv(variable, value)
    if ok:
        load_settings()
    else:
        with pytest.raises(ConfigurationError) as info:
            load_settings()
        assert info.value.variable == variable
