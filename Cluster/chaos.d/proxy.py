"""A userspace TCP proxy in front of each node's peer port: the "bad network" of RELIABILITY.md.

This kernel has no `tc netem`, so link latency and loss are simulated here. The harness starts this
file as one separate process (its own interpreter, so relaying never competes with the model
clients for the GIL) serving one listener per node, and steers it over stdin, one command a line:

    slow <i> on|off     traffic to node <i> (and, where sources can be told apart, from it) gets
                        50 ms ± 20 ms per chunk, plus a ~200 ms stall on 5% of chunks (loss
                        followed by a retransmission, as TCP would see it)
    quit                close everything and exit

Each command is answered with one line `ok ...`. With no fault active, bytes pass straight through.
Ordering within a connection is kept: a chunk is never released before the one read before it.

Usage (by the harness): proxy.py CONFIG_JSON, where CONFIG_JSON is
    {"proxies": [{"node": 1, "listen": ["127.0.0.1", 17401], "upstream": ["127.0.0.1", 7401]}, ...],
     "sources": {"10.78.0.1": 1, ...},      # peer source address -> node, when addresses tell nodes apart
     "seed": 7}
"""
import asyncio
import json
import random
import sys
import time

DELAY = 0.050      # mean added delay per chunk, seconds
JITTER = 0.020     # ± uniform jitter
LOSS = 0.05        # share of chunks that get an extra stall
STALL = 0.200      # the stall: a lost segment resent after a retransmission timeout
CHUNK = 65536


class Proxies:
    def __init__(self, config):
        self.config = config
        self.slow = set()                         # nodes whose link is bad now
        self.sources = config.get("sources", {})  # source ip -> node index
        self.rng = random.Random(config.get("seed", 0))
        self.servers = []
        self.connections = set()

    def is_slow(self, node, source):
        return node in self.slow or self.sources.get(source) in self.slow

    def delay(self):
        d = DELAY + self.rng.uniform(-JITTER, JITTER)
        if self.rng.random() < LOSS:
            d += STALL
        return d

    async def start(self):
        for p in self.config["proxies"]:
            node = p["node"]
            up = tuple(p["upstream"])
            server = await asyncio.start_server(
                lambda r, w, node=node, up=up: self.serve(r, w, node, up),
                host=p["listen"][0], port=p["listen"][1], reuse_address=True, backlog=256)
            self.servers.append(server)

    async def serve(self, reader, writer, node, upstream):
        source = (writer.get_extra_info("peername") or ("", 0))[0]
        try:
            # bounded: a node that cannot be reached (cut off, paused) makes the connect stall like TCP would
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*upstream), timeout=10)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return
        conn = (writer, up_w)
        self.connections.add(conn)
        try:
            await asyncio.gather(self.pump(reader, up_w, node, source), self.pump(up_r, writer, node, source))
        finally:
            self.connections.discard(conn)
            for w in conn:
                w.close()

    async def pump(self, reader, writer, node, source):
        """Copies one direction. Chunks go through a queue with a release time each, so a delay never
        reorders bytes and switching the fault off lets the queue drain in order."""
        queue = asyncio.Queue()

        async def release():
            while True:
                at, data = await queue.get()
                if data is None:
                    break
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(release())
        last = 0.0
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                now = time.monotonic()
                at = now + self.delay() if self.is_slow(node, source) else now
                last = max(last, at)
                await queue.put((last, data))
        except (ConnectionError, OSError):
            pass
        finally:
            await queue.put((0, None))
            try:
                await asyncio.wait_for(sender, timeout=5)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                sender.cancel()
            try:
                if writer.can_write_eof():
                    writer.write_eof()
            except (OSError, RuntimeError):
                pass

    async def commands(self):
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                return
            if words[0] == "slow" and len(words) == 3:
                node = int(words[1])
                (self.slow.add if words[2] == "on" else self.slow.discard)(node)
                print(f"ok slow {sorted(self.slow)}", flush=True)
            else:
                print(f"ok unknown {line.strip()}", flush=True)


async def main():
    proxies = Proxies(json.loads(sys.argv[1]))
    await proxies.start()
    print("ok started", flush=True)
    await proxies.commands()
    for s in proxies.servers:
        s.close()
    for conn in list(proxies.connections):
        for w in conn:
            w.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
