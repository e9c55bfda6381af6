"""Topic identity shared by the broker and its handlers: "already exists".

Topic ids (KIP-516) are kept by the log manager (``LogManager.topic_id`` / ``topic_name``)
from each partition directory's ``partition.metadata``
(:mod:`logstore.storage.partition_metadata`): random at creation, persisted, forgotten with
the topic, so a recreated topic never answers to the id of the one it replaced.

Kept apart from :mod:`logstore.server.broker` so that handlers never import the broker
(which imports the dispatcher, which imports the handler registry): the import graph stays
one-way, ``broker -> dispatch -> apis -> handlers -> topics``.
"""

from __future__ import annotations

from logstore.errors import LoglakeError

__all__ = ["TopicExistsError"]


class TopicExistsError(LoglakeError):
    """CreateTopics for a topic that already exists."""
