"""The loglake broker: the Kafka wire protocol over ``logstore.storage``.

- ``config``: ``BrokerConfig`` with Kafka's key names (``conf/broker.properties``).
- ``network``: the reactor (acceptor, processors, bounded request channel, handler threads,
  ``os.sendfile`` for fetched records); ``memory_pool``: the bounded request memory
  (``queued.max.request.bytes``) it reads frames into.
- ``apis`` / ``dispatch``: request framing, the API registry and request routing;
  ``registry``: the static table of handlers (plain imports: a broken module stops the
  start); ``handlers/<api>.py`` one module per Kafka API; ``group/`` the group coordinator
  and its APIs.
- ``error_codes``: the one table from typed errors to Kafka error codes; ``topics``: topic
  ids and "already exists", shared by the broker and its handlers.
- ``context``: what handlers receive (``RequestContext``) and may return (kio responses,
  ``RawResponse``, ``Deferred``, ``NO_RESPONSE``).
- ``purgatory``: delayed operations (Fetch long-polls).
- ``broker``: ``Broker`` ties them together; ``cli``: ``loglake broker``.
"""
