"""A TCP relay that delays every chunk by half a round trip each way (Redis "elsewhere").

    python benchmarks/_delay_proxy.py LISTEN_PORT TARGET_PORT RTT_MS

Runs until killed. Order is kept and chunks in flight overlap, so it adds
latency, not a bandwidth limit: what a Redis on another host costs.
"""

from __future__ import annotations

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def feed() -> None:
        while data := await reader.read(65536):
            await queue.put((loop.time() + delay, data))
        await queue.put(None)

    async def drain() -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(data)
            await writer.drain()
        writer.close()

    try:
        await asyncio.gather(feed(), drain())
    except (ConnectionError, OSError):
        writer.close()  # one side went away (a server process ended): drop the pair


async def main(listen: int, target: int, rtt_ms: float) -> None:
    delay = rtt_ms / 2000

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(client_r, server_w, delay), pipe(server_r, client_w, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
