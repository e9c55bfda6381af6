"""One module per Kafka API the broker implements (see ``logstore.server.apis``)."""
