"""Listener security: TLS contexts built from Kafka's ``ssl.*`` keys (:mod:`.tls`)."""
