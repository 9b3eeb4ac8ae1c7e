"""The TCP forwarder lives with the workstation tools (`outbox local` binds one
to the Docker bridge); the integration tests cut its connections to imitate a
partition or a failover."""

from outbox_tools.forward import Forwarder

__all__ = ["Forwarder"]
