"""Old import path of `publishers.redis.client` (the Redis channel's package), kept
so code written against it still runs: this module *is* that one, so patching
either path patches both."""

import sys

from .redis import client

sys.modules[__name__] = client
