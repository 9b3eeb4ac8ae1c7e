"""The tests' own Redis servers (`outbox_tools.redis_nodes`): a port taken between
choosing it and the server listening on it, as an outgoing connection of the test
process can take it, means another port, never a failed test."""

from __future__ import annotations

import socket

from outbox_tools.redis_nodes import _ephemeral_low, free_port
from support.redis_nodes import RedisNode


def test_a_node_whose_port_was_taken_starts_on_another(tmp_path):
    node = RedisNode(tmp_path)
    taken = socket.create_server(("127.0.0.1", node.port))
    try:
        node.start()
        assert node.port != taken.getsockname()[1]
        assert node.client().ping()
    finally:
        node.stop()
        taken.close()


def test_free_ports_are_chosen_below_the_range_outgoing_connections_use():
    assert all(10000 <= free_port() < _ephemeral_low() for _ in range(20))
