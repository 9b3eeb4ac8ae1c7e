"""The Amazon SES (v2) channel: error classification (`errors`), rate limiting
(`rate`), the sending pool (`pool`), request building (`requests`), the client
(`client`) and the publisher the relay drives (`publisher`)."""
