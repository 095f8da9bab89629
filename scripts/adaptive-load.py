#!/usr/bin/env python3
"""Drives the demo's GET /api/adaptive with N concurrent callers for a
while and checks what the adaptive limit promises (docs/demo.md):
admitted calls keep the backend's latency (p99 under --p99-ms), at least
--min-rate calls a second are admitted with 200, and every other call is
refused soon (429 or 503, with Retry-After). Standard library only: one
keep-alive HTTP/1.1 connection per caller.

usage: adaptive-load.py URL [--callers 64] [--seconds 10] [--p99-ms 60]
                            [--min-rate 360] [--refused-ms 60]
Prints one line: admitted=N rate=R/s p99_ms=P refused=M refused_p99_ms=Q
and exits 1 if a bound is missed.
"""
import argparse
import asyncio
import sys
import time
from urllib.parse import urlsplit


async def caller(host, port, path, stop, admitted, refused, errors):
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        while time.monotonic() < stop:
            started = time.monotonic()
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            if length:
                await reader.readexactly(length)
            took = (time.monotonic() - started) * 1000
            if status == 200:
                admitted.append(took)
            elif status in (429, 503) and "retry-after" in headers:
                refused.append(took)
            else:
                errors.append(status)
    finally:
        writer.close()


def p99(values):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--p99-ms", type=float, default=60)
    parser.add_argument("--min-rate", type=float, default=360)
    parser.add_argument("--refused-ms", type=float, default=60)
    args = parser.parse_args()
    url = urlsplit(args.url)
    path = url.path + (f"?{url.query}" if url.query else "")
    admitted, refused, errors = [], [], []
    started = time.monotonic()
    stop = started + args.seconds
    await asyncio.gather(
        *(
            caller(url.hostname, url.port or 80, path, stop, admitted, refused, errors)
            for _ in range(args.callers)
        )
    )
    elapsed = time.monotonic() - started
    rate = len(admitted) / elapsed
    line = (
        f"admitted={len(admitted)} rate={rate:.0f}/s p99_ms={p99(admitted):.1f} "
        f"refused={len(refused)} refused_p99_ms={p99(refused):.1f} other={len(errors)}"
    )
    print(line)
    failed = []
    if errors:
        failed.append(f"{len(errors)} answers were neither 200 nor a refusal with Retry-After: {sorted(set(errors))}")
    if p99(admitted) >= args.p99_ms:
        failed.append(f"admitted p99 {p99(admitted):.1f} ms is not under {args.p99_ms} ms")
    if rate < args.min_rate:
        failed.append(f"{rate:.0f} admitted/s is under {args.min_rate}")
    if p99(refused) >= args.refused_ms:
        failed.append(f"refused p99 {p99(refused):.1f} ms is not under {args.refused_ms} ms")
    for reason in failed:
        print(f"FAIL: {reason}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
