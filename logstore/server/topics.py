"""Topic identity shared by the broker and its handlers: topic ids and "already exists".

Kept apart from :mod:`logstore.server.broker` so that handlers never import the broker
(which imports the dispatcher, which imports the handler registry): the import graph stays
one-way, ``broker -> dispatch -> apis -> handlers -> topics``.
"""

from __future__ import annotations

import uuid

from logstore.errors import LoglakeError

__all__ = ["TOPIC_ID_NAMESPACE", "TopicExistsError", "topic_id_for"]

# Topic ids are derived from the name (uuid5) so that they are stable across restarts
# without a partition.metadata file; recreating a topic therefore reuses its id.
TOPIC_ID_NAMESPACE = uuid.UUID("6f1e3c4a-9b7d-4e52-8a61-0c3d5b2f7e90")


def topic_id_for(topic: str) -> uuid.UUID:
    return uuid.uuid5(TOPIC_ID_NAMESPACE, topic)


class TopicExistsError(LoglakeError):
    """CreateTopics for a topic that already exists."""
