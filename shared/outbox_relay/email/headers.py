"""Headers as the MIME message will write them (the standard library's `email`
package, SMTP policy), so a header value is refused at enqueue if it could not be."""

from __future__ import annotations

from email import policy as email_policy

#: CRLF line endings, headers folded at 78 characters.
MIME_POLICY = email_policy.SMTP


def header_problem(name: str, value: str) -> str | None:
    """Why `value` is not a `name` header the `email` package can write (None when it is).

    The package parses structured headers by name (address headers such as
    ``Resent-To``, dates, …). On some malformed values it raises (IndexError,
    TypeError, HeaderParseError and others); on most it records defects on the
    header instead and keeps going, so ``Resent-To: not an address`` would be
    sent as it is. Either means the value is not that header."""
    try:
        header = MIME_POLICY.header_factory(name, value)
        header.fold(policy=MIME_POLICY)
    except Exception as exc:
        return f"cannot be written as a {name} header ({type(exc).__name__})"
    if header.defects:
        # The defect's own text may quote the value: name its kind only.
        return f"does not parse as a {name} header ({type(header.defects[0]).__name__})"
    return None
