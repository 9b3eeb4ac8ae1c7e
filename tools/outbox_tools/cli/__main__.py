"""`python -m outbox_tools.cli`: the `outbox` command."""

from . import main

main(prog_name="outbox")
