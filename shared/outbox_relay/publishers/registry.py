"""The channels, in one list: a channel not listed here does not exist (docs/howto/add-a-channel.md)."""

from __future__ import annotations

import enum

from . import eventbridge, kinesis, redis, ses, sns, sqs
from .spec import ChannelSpec

CHANNELS: tuple[ChannelSpec, ...] = (redis.SPEC, ses.SPEC, sqs.SPEC, sns.SPEC, eventbridge.SPEC, kinesis.SPEC)

#: One member per channel (`REDIS = "redis"`): what OUTBOX_CHANNEL and the `channel` column hold.
Channel = enum.Enum("Channel", [(spec.name.upper(), spec.name) for spec in CHANNELS], type=str)  # type: ignore[misc]

_BY_NAME = {spec.name: spec for spec in CHANNELS}


def spec_for(channel: str) -> ChannelSpec:
    try:
        return _BY_NAME[Channel(channel).value]
    except ValueError:
        raise KeyError(f"no channel {channel!r} is registered (publishers/registry.py)") from None
