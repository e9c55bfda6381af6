"""The group coordinator: Kafka's classic consumer-group protocol and committed offsets.

- ``coordinator``: ``GroupCoordinator(log_manager, *, config, clock)`` with ``start()``,
  ``tick(now_ms)``, ``shutdown()`` and one method per group API; ``rebalance``: its
  JoinGroup/SyncGroup state machine; ``group``: one group's in-memory state.
- ``offset_store`` / ``schemas``: the compacted ``__consumer_offsets`` topic in our own log,
  with Kafka's record formats (offset commit key v1 / value v3, group metadata key v2 /
  value v3), reloaded on start.
- ``handlers``: ``API_HANDLERS`` (api key -> min version, max version, handler) merged into
  the broker's registry; ``messages``: the version-independent requests and answers.
- ``config``: ``GroupConfig`` under Kafka's ``group.*`` / ``offsets.*`` names.
"""

__all__: list[str] = []
