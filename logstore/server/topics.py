"""Topic identity shared by the broker and its handlers: topic ids and "already exists".

Kept apart from :mod:`logstore.server.broker` so that handlers never import the broker
(which imports the dispatcher, which imports the handler registry): the import graph stays
one-way, ``broker -> dispatch -> apis -> handlers -> topics``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from logstore.errors import LoglakeError

__all__ = ["TOPIC_ID_NAMESPACE", "TopicExistsError", "topic_id_for", "topic_name_for"]

# Topic ids are derived from the name (uuid5) so that they are stable across restarts
# without a partition.metadata file; recreating a topic therefore reuses its id.
TOPIC_ID_NAMESPACE = uuid.UUID("6f1e3c4a-9b7d-4e52-8a61-0c3d5b2f7e90")


# Both directions, filled by topic_id_for: a topic id reaches a client only through an answer
# that called it (Metadata, CreateTopics, DeleteTopics), so Fetch v13+ (KIP-516) resolves the
# ids clients send with one dict read, fit for the network threads. Entries are never
# removed: one per topic name this process answered about (existing topics only), and an
# id maps to one name forever (uuid5). Plain dict reads and writes (atomic under the GIL),
# with idempotent values: any thread may call these.
_IDS: dict[str, uuid.UUID] = {}
_NAMES: dict[uuid.UUID, str] = {}


def topic_id_for(topic: str) -> uuid.UUID:
    tid = _IDS.get(topic)
    if tid is None:
        tid = uuid.uuid5(TOPIC_ID_NAMESPACE, topic)
        _NAMES[tid] = topic
        _IDS[topic] = tid
    return tid


def topic_name_for(
    topic_id: uuid.UUID, *, candidates: Callable[[], Iterable[str]] | None = None
) -> str | None:
    """The topic name whose id is ``topic_id``, or None.

    Looks in the names this process gave ids to; when not there and ``candidates`` is given
    (e.g. the broker's topics: a client may keep an id from before a restart), computes the
    ids of those names. The caller checks that the topic still exists.
    """
    name = _NAMES.get(topic_id)
    if name is None and candidates is not None:
        for candidate in candidates():
            if topic_id_for(candidate) == topic_id:
                return candidate
    return name


class TopicExistsError(LoglakeError):
    """CreateTopics for a topic that already exists."""
