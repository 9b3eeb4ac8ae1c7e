"""How the AWS batch channels classify an error code (`aws_errors.classify_code`), with each
channel's own codes: throttled, our configuration (StopBatch, or permanent when the message
chose the destination), the message's fault, and transient."""

import pytest

from outbox_relay.models import ErrorClass
from outbox_relay.publishers.aws_client import CREDENTIAL_CODES
from outbox_relay.publishers.aws_errors import Verdict, classify_code
from outbox_relay.publishers.eventbridge.publisher import CODES as EVENTBRIDGE
from outbox_relay.publishers.sns.publisher import CODES as SNS
from outbox_relay.publishers.sqs.publisher import CODES as SQS

CHANNELS = {"sqs": SQS, "sns": SNS, "eventbridge": EVENTBRIDGE}


def _all(kind):
    return [(name, code) for name, codes in CHANNELS.items() for code in sorted(getattr(codes, kind))]


@pytest.mark.parametrize(("channel", "code"), _all("throttled"))
def test_a_throttle_is_throttled_whoever_chose_the_destination(channel, code):
    for own in (True, False):
        c = classify_code(CHANNELS[channel], code, True, own_destination=own)
        assert (c.error_class, c.verdict) == (ErrorClass.THROTTLED, Verdict.MESSAGE)


@pytest.mark.parametrize(("channel", "code"), _all("configuration"))
def test_a_refused_destination_stops_the_batch_when_it_is_the_relays_own(channel, code):
    c = classify_code(CHANNELS[channel], code, True, own_destination=True)
    assert (c.error_class, c.verdict) == (ErrorClass.CONFIGURATION, Verdict.STOP)


@pytest.mark.parametrize("code", sorted(EVENTBRIDGE.configuration))
def test_a_refused_bus_the_message_chose_is_its_own_fault(code):
    # Only EventBridge messages choose their destination; SQS and SNS send to the relay's own
    c = classify_code(EVENTBRIDGE, code, None, own_destination=False)
    assert (c.error_class, c.verdict) == (ErrorClass.PERMANENT, Verdict.MESSAGE)


@pytest.mark.parametrize("code", sorted(CREDENTIAL_CODES))
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_refused_credentials_stop_the_batch_on_the_relays_own_destination(channel, code):
    c = classify_code(CHANNELS[channel], code, True, own_destination=True)
    assert (c.error_class, c.verdict) == (ErrorClass.CONFIGURATION, Verdict.STOP)


@pytest.mark.parametrize("code", ["ExpiredTokenException", "ExpiredToken", "UnrecognizedClientException",
                                  "InvalidSignatureException", "SignatureDoesNotMatch", "InvalidClientTokenId",
                                  "MissingAuthenticationTokenException", "IncompleteSignature"])
def test_our_own_credentials_refused_stop_the_batch_even_on_a_bus_the_message_chose(code):
    # Expired or wrong credentials are ours whatever the bus: dead-lettering would lose every
    # message that names its bus until the credentials come back
    c = classify_code(EVENTBRIDGE, code, None, own_destination=False)
    assert (c.error_class, c.verdict) == (ErrorClass.CONFIGURATION, Verdict.STOP)


@pytest.mark.parametrize("code", ["AccessDeniedException", "AccessDenied"])
def test_access_denied_to_a_bus_the_message_chose_is_its_own_fault(code):
    c = classify_code(EVENTBRIDGE, code, None, own_destination=False)
    assert (c.error_class, c.verdict) == (ErrorClass.PERMANENT, Verdict.MESSAGE)
