"""Listener security: TLS contexts from Kafka's ``ssl.*`` keys (:mod:`.tls`), principals and
``ssl.principal.mapping.rules`` (:mod:`.principal`), SASL settings and sessions with PLAIN
(:mod:`.sasl`), SCRAM credentials and exchanges (:mod:`.scram`), ACLs and their durable store
(:mod:`.acls`) and the authorizer's decisions (:mod:`.authorizer`)."""
