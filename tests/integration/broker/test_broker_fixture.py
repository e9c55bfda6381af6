"""The broker fixture itself: a port taken between ``free_port()`` and the broker's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.fixtures.broker import BrokerProcess, api_versions_probe


def test_a_port_taken_before_the_broker_binds_it_is_replaced(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker")
    taken = b.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((b.host, taken))
        squatter.listen()
        try:
            b.start()
            assert b.port != taken
            assert "Address already in use" in b.log_text()
            assert api_versions_probe(b.host, b.port)
            port = b.port
            b.restart()  # a restart keeps the port clients were given
            assert b.port == port and api_versions_probe(b.host, b.port)
        finally:
            b.close()
