"""Route revisions: bumped inside the mutating transaction, published after commit.

Clustered: Redis pub/sub on CHANNEL. Embedded: in-process listeners. Replicas also poll the
revision, so a lost message only delays convergence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction
from django.db.models import F

from registry.models import RouteRevision

log = logging.getLogger(__name__)
CHANNEL = "mmc:routes"
_listeners: list[Callable[[int], None]] = []
_lock = threading.Lock()
_redis = None


def bump_revision() -> int:
    """+1 on the global revision (row-locked until commit) and publish it once committed."""
    updated = RouteRevision.objects.filter(pk=1).update(value=F("value") + 1)
    if not updated:
        RouteRevision.objects.get_or_create(pk=1, defaults={"value": 0})
        RouteRevision.objects.filter(pk=1).update(value=F("value") + 1)
    revision = RouteRevision.objects.values_list("value", flat=True).get(pk=1)
    transaction.on_commit(lambda: publish(revision))
    return revision


def current_revision() -> int:
    return RouteRevision.objects.filter(pk=1).values_list("value", flat=True).first() or 0


def redis_client():
    global _redis
    if _redis is None and settings.REDIS_URL:
        import redis  # clustered mode only: the embedded process never pays for it

        _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2,
                                      socket_connect_timeout=2)
    return _redis


def publish(revision: int) -> None:
    for listener in list(_listeners):
        try:
            listener(revision)
        except Exception:  # a broken listener must not break the mutation that committed
            log.exception("route listener failed")
    client = redis_client()
    if client is not None:
        try:
            client.publish(CHANNEL, str(revision))
        except Exception as exc:  # replicas poll too
            log.warning("could not publish revision %s: %s", revision, exc)


def subscribe_in_process(callback: Callable[[int], None]) -> Callable[[], None]:
    with _lock:
        _listeners.append(callback)

    def unsubscribe() -> None:
        with _lock:
            if callback in _listeners:
                _listeners.remove(callback)

    return unsubscribe


def listen_redis(callback: Callable[[int], None], stop: threading.Event) -> None:
    """Call callback(revision) for every revision published on CHANNEL until `stop` is set
    (a thread's loop, clustered mode). Redis down: tried again with back-off up to 5 s, quietly
    (whoever listens also polls, so it converges meanwhile)."""
    import redis  # clustered mode only: the embedded process never pays for it

    delay = 0.2
    while not stop.is_set():
        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2,
                                          health_check_interval=5)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(CHANNEL)
            delay = 0.2
            while not stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "message":
                    callback(int(message["data"]))
        except Exception as exc:
            log.debug("route subscription lost: %s", exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
