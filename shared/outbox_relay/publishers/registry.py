"""The channels, in one list: each is a package under `publishers/` exporting a
`ChannelSpec` as `SPEC`. Runtime, settings, the producer API, observability, the
CLI and the template tests read it, and `Channel` is made from it; a channel not
listed here does not exist (docs/howto/add-a-channel.md).

Add a channel: import its package and list its `SPEC` in `CHANNELS`.
"""

from __future__ import annotations

import enum

from . import eventbridge, kinesis, redis, ses, sns, sqs
from .spec import ChannelSpec

CHANNELS: tuple[ChannelSpec, ...] = (redis.SPEC, ses.SPEC, sqs.SPEC, sns.SPEC, eventbridge.SPEC,
                                         kinesis.SPEC)

#: Where a message goes, one member per registered channel (`REDIS = "redis"`): its value is
#: what OUTBOX_CHANNEL and the `channel` column hold. Each channel runs as its own relay function.
Channel = enum.Enum("Channel", [(spec.name.upper(), spec.name) for spec in CHANNELS], type=str)  # type: ignore[misc]

_BY_NAME = {spec.name: spec for spec in CHANNELS}


def spec_for(channel: str) -> ChannelSpec:
    """The spec of `channel` (a `Channel` or its value); KeyError names a channel no
    package registers."""
    try:
        return _BY_NAME[Channel(channel).value]
    except ValueError:
        raise KeyError(f"no channel {channel!r} is registered (publishers/registry.py)") from None
