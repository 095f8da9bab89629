// The fixed window of node rate-limiter-flexible (RateLimiterRedis on an
// ioredis client), driven like benches/decisions.rs drives Limiter::check:
// `concurrency` loops over 10k identities, each at its own place, for a
// warm-up and then a measured time. Run by benches/decisions.rs with the
// modules installed by scripts/peers-install.sh; prints one JSON line.
//
//   node rate_limiter_flexible.js <port> <concurrency> <warmup s> <measure s>
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [port, concurrency, warmup, measure] = process.argv.slice(2).map(Number);
const KEYS = 10000;
const keys = Array.from({ length: KEYS }, (_, i) => `ip:10.0.${Math.floor(i / 256)}.${i % 256}`);

async function phase(limiter, seconds, timed) {
  const deadline = performance.now() + seconds * 1000;
  const latencies = [];
  let decisions = 0;
  let admitted = 0;
  let errors = 0;
  const task = async (t) => {
    let n = 0;
    while (performance.now() < deadline) {
      const key = keys[(t * 157 + n) % KEYS];
      n += 1;
      const start = timed ? performance.now() : 0;
      try {
        await limiter.consume(key, 1);
        admitted += 1;
      } catch (e) {
        // A refusal is a RateLimiterRes; anything else is an error.
        if (!(e && typeof e.msBeforeNext === 'number')) errors += 1;
      }
      if (timed) latencies.push(performance.now() - start);
      decisions += 1;
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: concurrency }, (_, t) => task(t)));
  const secs = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  const at = (p) => (latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] * 1000 : 0);
  return { decisions, admitted, errors, secs, p50_us: at(0.5), p99_us: at(0.99) };
}

(async () => {
  const redis = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true });
  // Far above any load: every call is admitted, as in the Rust cases.
  const limiter = new RateLimiterRedis({ storeClient: redis, keyPrefix: 'rlf', points: 1e9, duration: 1 });
  const warm = await phase(limiter, warmup, false);
  const result = await phase(limiter, measure, true);
  result.all_decisions = warm.decisions + result.decisions;
  console.log(JSON.stringify(result));
  redis.disconnect();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
