"""``loglake broker --config conf/broker.properties [--override key=value ...]``.

Starts the broker in the foreground and logs to stderr. SIGTERM (or SIGINT) shuts it down
cleanly: stop accepting, answer in-flight requests, flush, write checkpoints and the
clean-shutdown marker, exit 0. When the log state could not be fully persisted at shutdown (a
full disk, an I/O error: each failure is logged) it exits 3 after doing what it could, with no
clean-shutdown marker, so the next start recovers; nothing acknowledged is lost. A
configuration error exits 2 with one line naming the key; a log directory locked by another
process or logs that cannot be opened exit 1 with one line. A broker module that fails to
import (a broken install, a handler with a bug at import) exits 1 with a line naming the
module and the error, then its traceback: the broker never starts without some of its APIs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import traceback
from types import FrameType

from logstore.errors import InvalidConfigError, LogDirLockedError, LoglakeError
from logstore.server.config import BrokerConfig, ConfigError

__all__ = ["add_arguments", "run"]

log = logging.getLogger("logstore.server")


EPILOG = (
    "Exit codes: 0 stopped cleanly by SIGTERM or SIGINT (logs flushed, checkpoints and the"
    " clean-shutdown marker written); 1 error: a log directory locked by another process, logs"
    " that cannot be opened, the listener cannot bind, or a broker module fails to import;"
    " 2 bad arguments or a configuration error (one line naming the key, or the topic-config"
    " file); 3 stopped, but the"
    " log state could not be fully persisted (a full disk, an I/O error: logged; no"
    " clean-shutdown marker, the next start recovers; nothing acknowledged is lost);"
    " 130 interrupted (Ctrl-C) while it loads its configuration and modules, before its signal"
    " handlers are set."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="broker properties file (Kafka key names; Kafka's stock KRaft server.properties"
        " works as it is)",
    )
    parser.add_argument(
        "--override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="set a property, overriding the file (repeatable)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )


def _failing_module(exc: BaseException) -> str:
    """The innermost logstore file in ``exc``'s traceback (the module that failed)."""
    found = "unknown module"
    for frame in traceback.extract_tb(exc.__traceback__):
        if "logstore" in frame.filename:
            found = frame.filename
    return found


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = BrokerConfig.load(args.config, overrides=args.override)
    except ConfigError as exc:
        print(f"loglake broker: configuration error: {exc}", file=sys.stderr)
        return 2
    # Imported after the config is known good: opening the logs is the slow part.
    try:
        from logstore.server.broker import Broker  # noqa: PLC0415
    except Exception as exc:
        where = exc.filename if isinstance(exc, SyntaxError) else _failing_module(exc)
        print(
            f"loglake broker: cannot start: a broker module failed to import ({where}):"
            f" {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker = Broker(config)
    except LogDirLockedError as exc:
        print(f"loglake broker: {exc}", file=sys.stderr)
        return 1
    except InvalidConfigError as exc:  # a topic-config file breaking its key's rule
        print(f"loglake broker: configuration error: {exc}", file=sys.stderr)
        return 2
    except (LoglakeError, OSError) as exc:
        print(f"loglake broker: cannot open the logs: {exc}", file=sys.stderr)
        return 1
    try:
        broker.start()
    except OSError as exc:
        print(f"loglake broker: {exc}", file=sys.stderr)
        broker.shutdown()
        return 1
    # Readiness line for supervisors and tests: the port actually bound (listeners may say 0).
    print(f"loglake broker started on {broker.advertised_host}:{broker.port}", flush=True)
    while not stop.wait(1.0):
        pass
    return 0 if broker.shutdown() else 3
