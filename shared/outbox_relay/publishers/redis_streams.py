"""Old import path of `publishers.redis.streams` (the Redis channel's package), kept
so code written against it still runs: this module *is* that one, so patching
either path patches both."""

import sys

from .redis import streams

sys.modules[__name__] = streams
