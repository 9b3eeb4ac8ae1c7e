"""Email addresses, one mailbox in the grammar of MAILBOX_PATTERN (the standard library's RFC 5322 parser,
then `email-validator`), and headers as the MIME message will write them, so a value is refused at enqueue
if it could not be. Three narrowings keep one grammar (decision 0052): encoded words only in UTF-8 or
US-ASCII, dates only in RFC 5322's own form, Resent-* address headers only as the recipient fields take them."""

from __future__ import annotations

import re
from email import policy as email_policy
from email.header import Header
from email.headerregistry import Address
from email.utils import formataddr

from email_validator import EmailNotValidError, validate_email

# Control characters but TAB, and whatever Python takes for a line break: none may reach a header.
CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# The one grammar of a mailbox (decision 0052): an address, or a display name of atoms, quoted strings and
# encoded words, then an address in angle brackets; no comments, no obsolete forms.
ADDR_SPEC_PATTERN = r'(?!=\?)[^ \t()<>@,:;\\"\[\]]+@(?!=\?)[^ \t()<>@,:;\\"\[\]]+'
PHRASE_PATTERN = r'(?:"(?:[^"\\]|\\.)*"|=\?[^? \t]*\?[bBqQ]\?[^? \t]*\?=|[^ \t()<>@,:;.\\"\[\]]|[ \t])+'
MAILBOX_PATTERN = rf"^(?:{ADDR_SPEC_PATTERN}|(?:{PHRASE_PATTERN})?<{ADDR_SPEC_PATTERN}>)$"
_MAILBOX_RE = re.compile(MAILBOX_PATTERN)
NOT_IN_GRAMMAR = ('is not a well-formed address in a form taken here: address, <address>, Display Name <address> '
                  'or "Quoted Name" <address> (no comments, no encoded word in the address)')


def parse_address(value: str) -> str:
    """One mailbox's canonical form: the display name as given, the address as `email-validator`
    normalises it, the domain in punycode (SES takes no SMTPUTF8). ValueError says what is wrong."""
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if CONTROL_RE.search(value):
        raise ValueError("must not contain CR, LF, NUL or other control characters (header injection)")
    value = value.strip()
    if not value:
        raise ValueError("must not be blank")
    try:
        header = email_policy.default.header_factory("To", value)
    except Exception:  # the stdlib parser gives up on some malformed input with IndexError & co
        raise ValueError("is not a well-formed address") from None
    if header.defects:
        if all(type(d).__name__ == "NonASCIILocalPartDefect" for d in header.defects):
            raise ValueError("has a non-ASCII local part (before the @), which SES does not accept")
        raise ValueError("is not a well-formed address")
    if len(header.groups) != 1 or header.groups[0].display_name is not None or len(header.addresses) != 1:
        raise ValueError("must be exactly one address (use a list for several)")
    if not _MAILBOX_RE.fullmatch(value):
        raise ValueError(NOT_IN_GRAMMAR)
    problem = encoded_word_problem(header)
    if problem:
        raise ValueError(problem)
    mailbox = header.addresses[0]
    try:
        checked = validate_email(mailbox.addr_spec, check_deliverability=False, allow_smtputf8=False)
    except EmailNotValidError as exc:
        raise ValueError(f"is not a valid address ({_without_address(str(exc), mailbox.addr_spec)})") from None
    # RFC 5321's limit, which email-validator checks only in its strict mode (and SES holds to).
    if len(checked.local_part) > 64:
        raise ValueError("is not a valid address (too long before the @-sign)")
    ascii_address = checked.ascii_email or checked.normalized
    if not mailbox.display_name:
        return ascii_address
    return str(Address(display_name=mailbox.display_name, addr_spec=ascii_address))


#: The charsets an encoded word (RFC 2047) may name.
ENCODED_WORD_CHARSETS = frozenset({"utf-8", "us-ascii"})


def encoded_word_problem(header) -> str | None:
    """Why `header`'s encoded words are not taken: only UTF-8 and US-ASCII, not every charset Python knows."""
    stack = [header._parse_tree]
    while stack:
        token = stack.pop()
        if getattr(token, "token_type", None) == "encoded-word" and token.charset.lower() not in ENCODED_WORD_CHARSETS:
            return "has an encoded word (=?charset?…?=) in a charset other than UTF-8 or US-ASCII"
        if isinstance(token, list):
            stack.extend(token)
    return None


def address_of(canonical: str) -> str:
    return email_policy.default.header_factory("To", canonical).addresses[0].addr_spec


def encode_address(canonical: str) -> str:
    """The display name RFC 2047-encoded when not ASCII, as SES's API fields expect ("SendEmail")."""
    mailbox = email_policy.default.header_factory("To", canonical).addresses[0]
    if not mailbox.display_name:
        return mailbox.addr_spec
    return formataddr((mailbox.display_name, mailbox.addr_spec), charset="utf-8")


def _without_address(text: str, address: str) -> str:
    return text.replace(address, "<address>")


def encode_header_value(value: str) -> str:
    """A header value as one line of printable ASCII (RFC 2047 encoded words when not ASCII)."""
    if value.isascii():
        return value
    return Header(value, "utf-8").encode(maxlinelen=0)


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
