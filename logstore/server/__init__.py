"""The loglake broker: the Kafka wire protocol over ``logstore.storage``.

- ``config``: ``BrokerConfig`` with Kafka's key names (``conf/broker.properties``).
- ``network``: the reactor (acceptor, processors, bounded request channel, handler threads,
  ``os.sendfile`` for fetched records); ``memory_pool``: the bounded request memory
  (``queued.max.request.bytes``) it reads frames into.
- ``apis`` / ``dispatch``: the API registry and request routing; ``handlers/<api>.py`` one
  module per Kafka API; ``group/`` the group coordinator and its APIs.
- ``context``: what handlers receive (``RequestContext``) and may return (kio responses,
  ``RawResponse``, ``Deferred``, ``NO_RESPONSE``).
- ``purgatory``: delayed operations (Fetch long-polls).
- ``broker``: ``Broker`` ties them together; ``cli``: ``loglake broker``.
"""
