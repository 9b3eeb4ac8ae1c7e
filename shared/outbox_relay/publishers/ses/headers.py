"""Headers as the MIME message will write them, so a value is refused at enqueue if it could not be.
Three narrowings keep one grammar (decision 0052): encoded words only in UTF-8 or US-ASCII, dates only
in RFC 5322's own form, and Resent-* address headers only as the recipient fields take them."""

from __future__ import annotations

import re
from email import policy as email_policy

from .addresses import encoded_word_problem, parse_address

#: CRLF line endings, headers folded at 78 characters.
MIME_POLICY = email_policy.SMTP

#: RFC 5322 date-time without its obsolete forms (named zones, two-digit years) or comments.
DATE_PATTERN = (r"^(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), +)?[0-9]{1,2} +(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct"
                r"|Nov|Dec) +(?:19|[2-9][0-9])[0-9]{2} +[0-9]{2}:[0-9]{2}(?::[0-9]{2})? +[+-][0-9]{4}$")
DATE_HEADERS = frozenset({"resent-date", "orig-date"})
#: Address headers a custom header may be (the others are the message's own fields).
ADDRESS_HEADERS = frozenset({"resent-from", "resent-sender", "resent-to", "resent-cc", "resent-bcc"})
#: An empty group (``undisclosed-recipients:;``), which Resent-To, -Cc and -Bcc may be instead of addresses.
EMPTY_GROUP_PATTERN = r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?: [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*:;$"
_DATE_RE = re.compile(DATE_PATTERN)
_EMPTY_GROUP_RE = re.compile(EMPTY_GROUP_PATTERN)


def split_address_list(value: str) -> list[str]:
    """The items of an address list: commas inside a quoted string do not separate."""
    items, start, quoted, escaped = [], 0, False, False
    for i, ch in enumerate(value):
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == ",":
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return items


def header_problem(name: str, value: str) -> str | None:
    """Why `value` is not a `name` header (None when it is): on most malformed values the `email` package
    records defects and keeps going (``Resent-To: not an address`` would be sent as it is)."""
    lower = name.lower()
    if lower in DATE_HEADERS and not _DATE_RE.fullmatch(value):
        return "must be an RFC 5322 date such as 'Tue, 1 Jul 2003 10:52:37 +0200' (numeric zone, no comments)"
    if lower in ADDRESS_HEADERS and not (lower not in ("resent-from", "resent-sender")
                                         and _EMPTY_GROUP_RE.fullmatch(value)):
        items = split_address_list(value)
        if lower == "resent-sender" and len(items) != 1:
            return "must be one address"
        for i, item in enumerate(items):
            try:
                parse_address(item)
            except ValueError as exc:
                return f"address {i} {exc}"
    try:
        header = MIME_POLICY.header_factory(name, value)
        header.fold(policy=MIME_POLICY)
    except Exception as exc:
        return f"cannot be written as a {name} header ({type(exc).__name__})"
    # An unstructured header keeps its parse's defects (a malformed encoded word) to itself.
    defects = header.defects or header._parse_tree.all_defects
    if defects:
        # The defect's own text may quote the value: name its kind only.
        return f"does not parse as a {name} header ({type(defects[0]).__name__})"
    return encoded_word_problem(header)
