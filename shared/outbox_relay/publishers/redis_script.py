"""Old import path of `publishers.redis.script` (the Redis channel's package), kept
so code written against it still runs: this module *is* that one, so patching
either path patches both."""

import sys

from .redis import script

sys.modules[__name__] = script
