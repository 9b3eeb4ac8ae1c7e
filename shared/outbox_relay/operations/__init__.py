"""Operating the outbox: statistics, backlog figures, dead letters, redrive and
the retention purge. The `outbox` command line and the maintenance function
both call these; nothing here prints, reads the environment or builds an engine.

Every age, window and cutoff is computed by the database's clock; long work
runs in bounded batches, each one statement in its own short transaction.
"""
