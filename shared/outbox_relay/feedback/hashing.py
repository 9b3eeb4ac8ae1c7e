"""Email addresses as keyed hashes (HMAC-SHA-256 of the bare address, lower-cased), so the
feedback keeps none in clear and a hash cannot be tested against a guessed address
without the key (docs/decisions/0047-ambiguous-sends-and-a-hashed-suppression-list.md)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from ..errors import ConfigurationError

MIN_KEY_CHARS = 32


def normalise(address: str) -> str:
    """``Jiwoo <Jiwoo@Example.com>`` → ``jiwoo@example.com`` (servers match addresses case-insensitively)."""
    text = address.strip()
    if text.endswith(">") and "<" in text:
        text = text[text.rindex("<") + 1:-1]
    return text.strip().lower()


class AddressHasher:
    def __init__(self, key: str) -> None:
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_KEY_CHARS} characters")
        self._key = key.encode("utf-8")

    def hash(self, address: str) -> str:
        return hmac.new(self._key, normalise(address).encode("utf-8"), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never show the key
        return "AddressHasher(<key>)"


def address_hasher(settings: Any) -> AddressHasher:
    """OUTBOX_SES_ADDRESS_KEY's hasher, else the secret's; `ConfigurationError` naming the variable."""
    if settings.ses_address_key:
        variable, key = "OUTBOX_SES_ADDRESS_KEY", settings.ses_address_key
    elif settings.ses_address_key_secret_arn:
        from ..db import read_secret

        variable = "OUTBOX_SES_ADDRESS_KEY_SECRET_ARN"
        key = str(read_secret(variable, settings.ses_address_key_secret_arn))
    else:
        raise ConfigurationError("OUTBOX_SES_ADDRESS_KEY",
                                 "set it or OUTBOX_SES_ADDRESS_KEY_SECRET_ARN: addresses are kept as keyed hashes")
    try:
        return AddressHasher(key)
    except ValueError as exc:
        raise ConfigurationError(variable, f"the key {exc}") from None
