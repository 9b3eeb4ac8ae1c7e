"""DATABASE_URL's query: what pg8000 can take passes (a Unix socket, as the embedded
server's URL has), anything else is refused at start-up, not at the first connect."""

from __future__ import annotations

import pytest

from outbox_relay.urls import parse_database_url


def test_a_unix_socket_and_an_application_name_pass():
    url = parse_database_url("postgresql://postgres@/postgres?unix_sock=/tmp/pg/.s.PGSQL.5432&application_name=relay")
    assert url.drivername == "postgresql+pg8000"
    assert dict(url.query) == {"unix_sock": "/tmp/pg/.s.PGSQL.5432", "application_name": "relay"}


@pytest.mark.parametrize(("query", "says"), [("sslmode=require", "DATABASE_TLS"), ("timeout=5", "'timeout'"),
                                              ("foo=bar", "'foo'")])
def test_other_query_parameters_are_refused(query, says):
    with pytest.raises(ValueError) as info:
        parse_database_url(f"postgresql://postgres@127.0.0.1/db?{query}")
    assert says in str(info.value)
