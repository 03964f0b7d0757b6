"""The backend's kazoo handler: its ``select`` (one ``poll`` call) answers as kazoo's own
selector-based ``select`` does, on real sockets."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.handlers.utils import selector_select

from headway.lock.backends.zookeeper.bridge import InlineHandler, poll_ready

pytestmark = pytest.mark.skipif(not hasattr(InlineHandler, "select"), reason="no poll()")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


Ready = tuple[list[socket.socket], list[socket.socket], list[socket.socket]]


def both(rlist: list[socket.socket], wlist: list[socket.socket], timeout: float) -> Ready:
    """poll_ready's answer, checked against kazoo's."""
    ours = poll_ready(rlist, wlist, timeout)
    assert ours == selector_select(rlist, wlist, [], timeout)
    return ours


def test_nothing_to_read_waits_out_the_timeout_with_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    assert both([a, b], [], 0.01) == ([], [], [])


def test_a_socket_with_data_is_readable_and_a_socket_with_room_writable(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.sendall(b"x")
    assert both([a], [b], 0) == ([a], [b], [])
    assert both([a, b], [], 0) == ([a], [], [])
    # One descriptor asked both ways (kazoo never does; its select would list it twice).
    assert poll_ready([a], [a], 0) == ([a], [a], [])


def test_a_closed_peer_reads_as_readable_so_the_next_recv_tells(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.close()
    assert both([a], [], 1.0) == ([a], [], [])
    assert a.recv(1) == b""


def test_no_timeout_waits_until_a_socket_is_ready(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair

    def send_later() -> None:
        time.sleep(0.05)  # most likely once the poll waits; if not, it finds the data
        b.sendall(b"x")

    sender = threading.Thread(target=send_later)
    sender.start()
    try:
        assert poll_ready([a], [], None) == ([a], [], [])
    finally:
        sender.join()


def test_a_descriptor_closed_underneath_is_ready_so_the_next_call_raises(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _ = pair
    fd = os.dup(a.fileno())
    os.close(fd)
    assert poll_ready([fd], [fd], 0) == ([fd], [fd], [])
    with pytest.raises(OSError):
        os.read(fd, 1)


def test_bad_arguments_fail_as_kazoos_select_does(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    with pytest.raises(ValueError, match="non-negative"):
        poll_ready([a], [], -1)
    b.close()  # its descriptor is -1 now
    with pytest.raises(TypeError, match="Invalid file descriptor"):
        poll_ready([b], [], 0)
    with pytest.raises(TypeError, match="Invalid file descriptor"):
        selector_select([b], [], [], 0)


def test_the_handler_selects_with_poll(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.sendall(b"x")
    assert InlineHandler().select([a], [], [], 0) == ([a], [], [])
