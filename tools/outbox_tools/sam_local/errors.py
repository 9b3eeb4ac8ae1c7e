"""What `outbox local` raises when it cannot go on: one line a user can act on."""

from __future__ import annotations


class Unavailable(Exception):
    """Something the command needs is missing (Docker, a python3.12, the SAM CLI,
    root to build the stand-in image): the message says what, and how to provide it."""


class Failed(Exception):
    """A step that should have worked did not (sam build, the image build); the
    message is one line and names the log that holds the rest."""
