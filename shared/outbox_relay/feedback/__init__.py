"""SES feedback: the events SES publishes after it accepted an email (Send,
Delivery, Bounce, Complaint, Reject, Rendering Failure, DeliveryDelay), parsed
(`events`), recorded against their outbox messages and turned into the
suppression list (`store`), with addresses as keyed hashes (`hashing`); the
feedback function's work (`run`)."""
