"""`outbox demo`: a sample application's events (`events`) and emails (`emails`)
through the real relay handler, on the servers this machine has."""
