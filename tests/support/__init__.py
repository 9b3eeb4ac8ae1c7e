"""Test helpers shared by every layer: rows written by hand (`rows`), the SAM
template as a model (`template`), cleanup checks (`leftovers`), the SES fixtures
and helpers (`ses`), a claimer run as its own process (`claimer`), and fakes of
the store and publisher for the relay loop's unit tests (`fakes`)."""
