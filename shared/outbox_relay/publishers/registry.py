"""The channels, in one list: each is a package under `publishers/` exporting a
`ChannelSpec` as `SPEC`. Runtime, settings, observability, the CLI and the
template tests read it; a channel not listed here does not exist
(docs/howto/add-a-channel.md)."""

from __future__ import annotations

from ..models import Channel
from . import eventbridge, kinesis, redis, ses, sns, sqs
from .spec import ChannelSpec

CHANNELS: tuple[ChannelSpec, ...] = (redis.SPEC, ses.SPEC, sqs.SPEC, sns.SPEC, eventbridge.SPEC,
                                         kinesis.SPEC)

_BY_CHANNEL = {spec.channel: spec for spec in CHANNELS}


def spec_for(channel: Channel | str) -> ChannelSpec:
    """The spec of `channel`; KeyError names a channel no package registers."""
    try:
        return _BY_CHANNEL[Channel(channel)]
    except (KeyError, ValueError):
        raise KeyError(f"no channel {channel!r} is registered (publishers/registry.py)") from None
