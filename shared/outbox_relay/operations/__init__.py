"""Operating the outbox, for the `outbox` command and the maintenance function: nothing
here prints, reads the environment or builds an engine; times are the database's; long
work runs in bounded batches of one short transaction each."""
