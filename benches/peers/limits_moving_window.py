"""The moving window of Python `limits` (RedisStorage on redis-py), driven
like benches/decisions.rs drives Limiter::check: one synchronous loop (the
client is blocking, so one call in flight) over 10k identities for a
warm-up and then a measured time. Run by benches/decisions.rs with the
packages installed by scripts/peers-install.sh; prints one JSON line.

    python limits_moving_window.py <port> <warmup s> <measure s>
"""

import json
import sys
import time

from limits import RateLimitItemPerSecond
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

KEYS = 10_000


def phase(limiter, item, keys, seconds, timed):
    latencies = []
    decisions = admitted = 0
    started = time.perf_counter()
    deadline = started + seconds
    n = 0
    while time.perf_counter() < deadline:
        key = keys[n % KEYS]
        n += 1
        start = time.perf_counter()
        admitted += limiter.hit(item, key)
        if timed:
            latencies.append(time.perf_counter() - start)
        decisions += 1
    secs = time.perf_counter() - started
    latencies.sort()

    def at(p):
        if not latencies:
            return 0.0
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e6

    return {"decisions": decisions, "admitted": admitted, "errors": 0, "secs": secs,
            "p50_us": at(0.5), "p99_us": at(0.99)}


def main():
    port, warmup, measure = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    storage = RedisStorage(f"redis://127.0.0.1:{port}")
    limiter = MovingWindowRateLimiter(storage)
    # As the Rust cases: 1000 per 100 ms, as near as `limits` says it.
    item = RateLimitItemPerSecond(10_000)
    keys = [f"ip:10.0.{i // 256}.{i % 256}" for i in range(KEYS)]
    warm = phase(limiter, item, keys, warmup, False)
    result = phase(limiter, item, keys, measure, True)
    result["all_decisions"] = warm["decisions"] + result["decisions"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
