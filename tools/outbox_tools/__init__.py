"""Workstation tools of the outbox relay, never shipped in the Lambda layer: the
`outbox` command line, `outbox demo`, embedded servers, the local SES (moto) and
the imitation of the Lambda runtime that `outbox relay` runs the handlers in."""
