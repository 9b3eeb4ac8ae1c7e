"""SES feedback: SES's events parsed (`events`), recorded against their messages and
the suppression list (`store`), addresses as keyed hashes (`hashing`); the function (`run`)."""
