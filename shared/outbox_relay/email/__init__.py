"""Transactional email for the SES channel: addresses (`addresses`), the stored
payload and its validation (`payload`), and the raw MIME message (`mime`).
`enqueue_email`, the producer API, is in `outbox_relay.producer`."""
