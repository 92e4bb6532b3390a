"""A TCP proxy that delays every chunk it forwards, in both directions.

Puts a network's round trip between sessionstore and a PostgreSQL on the
same machine, to measure what the round trips of a write cost when the
database is on another host:

    python3 bench/scripts/delay_proxy.py 5499 5432 0.25 &
    sessionstore-bench --only append --postgres-url postgres://postgres@127.0.0.1:5499/postgres

Arguments: the port to listen on (127.0.0.1), the port to forward to, and
the delay each way in milliseconds. asyncio's timers are coarse: 0.25
gives about 1.1 ms each way on a 2-core VM (`pgbench` of `SELECT 1`
through the proxy: 2.4 ms a round trip, against 0.1 ms direct and 0.16 ms
through the proxy with no delay). Measure the round trip it gives before
quoting a figure measured through it. Order is kept: each direction's
chunks go out in the order they came, each no sooner than its delay.
"""

import asyncio
import socket
import sys

LISTEN, TARGET, DELAY = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000.0


async def pipe(reader, writer):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)

    task = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.put_nowait((loop.time() + DELAY, data))
    except OSError:
        pass
    queue.put_nowait((0, None))
    await task


async def handle(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", TARGET)
    except OSError:
        client_writer.close()
        return
    for writer in (client_writer, server_writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    async with server:
        await server.serve_forever()


asyncio.run(main())
