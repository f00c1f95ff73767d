// Real processes on loopback for the TypeScript SDK tests, as
// tests/e2e/conftest.py starts them for the Python ones: the simulated LLM
// upstream (`idemgate-llm-sim`) and `idemgate serve` in front of it, both
// built by cargo beforehand, each on a free port of 127.0.0.1. The tests
// talk to the gateway through the official SDKs and read the upstream's
// execution counters over HTTP.

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const TARGET = process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target');
const PROFILE = process.env.IDEMGATE_PROFILE ?? 'debug';

export const HEADER = 'Idempotency-Key';

function bin(name) {
  const path = join(TARGET, PROFILE, name);
  if (!existsSync(path)) {
    throw new Error(`${path} is missing: build it with \`cargo build -p ${name}\` first`);
  }
  return path;
}

function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.on('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
  });
}

async function waitHttp(url, exited) {
  const deadline = Date.now() + 20_000;
  let last;
  while (Date.now() < deadline) {
    if (exited.code !== undefined) throw new Error(`${url}: the process exited with ${exited.code}`);
    try {
      const r = await fetch(url);
      if (r.status === 200) return;
      last = r.status;
    } catch (e) {
      last = e; // not up yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} never answered: ${last}`);
}

function start(args) {
  const child = spawn(args[0], args.slice(1), { stdio: 'ignore' });
  const exited = {};
  const done = new Promise((ok) =>
    child.on('exit', (code, signal) => {
      exited.code = code ?? signal;
      ok(exited.code);
    }),
  );
  return { child, exited, done };
}

async function stop(proc) {
  if (proc.exited.code === undefined) proc.child.kill('SIGTERM');
  return proc.done;
}

// Two routes in front of the same simulator, told apart by a path prefix that
// is stripped before forwarding: `/reject` answers a duplicate of a running
// key with 409 at once, `/charging` is a `charges = true` route whose
// upstream gets 1 s for its first byte (then `outcome-unknown`).
const ROUTES = (sim) => `
[[routes]]
id = "reject"
prefix = "/reject"
strip_prefix = true
upstream = "${sim}"
on_inflight = "reject"

[[routes]]
id = "charging"
prefix = "/charging"
strip_prefix = true
upstream = "${sim}"
charges = true

[routes.timeouts]
first_byte = "1s"
`;

async function serve(simUrl, dir, config) {
  const [port, admin] = [await freePort(), await freePort()];
  const args = [
    bin('idemgate'),
    'serve',
    '--upstream',
    simUrl,
    '--listen',
    `127.0.0.1:${port}`,
    '--admin-listen',
    `127.0.0.1:${admin}`,
    '--store',
    `sqlite:${join(dir, 'idemgate.db')}`,
  ];
  if (config !== undefined) {
    writeFileSync(join(dir, 'idemgate.toml'), config);
    args.push('--config', join(dir, 'idemgate.toml'));
  }
  const proc = start(args);
  await waitHttp(`http://127.0.0.1:${admin}/healthz`, proc.exited);
  return { url: `http://127.0.0.1:${port}`, proc };
}

/**
 * Starts the simulator and two gateways in front of it: `gateway` with the
 * defaults (every path one route, a duplicate of a running key waits) and
 * `routes` with the `/reject` and `/charging` routes. `close()` stops them
 * and fails if a gateway did not shut down cleanly.
 */
export async function startStack() {
  const dir = mkdtempSync(join(tmpdir(), 'idemgate-e2e-ts-'));
  const simPort = await freePort();
  const simUrl = `http://127.0.0.1:${simPort}`;
  const sim = start([bin('idemgate-llm-sim'), '--listen', `127.0.0.1:${simPort}`]);
  const started = [];
  try {
    await waitHttp(`${simUrl}/sim/stats`, sim.exited);
    const plainDir = mkdtempSync(join(dir, 'gw-'));
    const routesDir = mkdtempSync(join(dir, 'gw-routes-'));
    const gateway = await serve(simUrl, plainDir);
    started.push(gateway);
    const routes = await serve(simUrl, routesDir, ROUTES(simUrl));
    started.push(routes);
    return {
      gateway: gateway.url,
      routes: routes.url,
      async executionsFor(key) {
        const r = await fetch(`${simUrl}/sim/executions/${encodeURIComponent(key)}`);
        const body = await r.json();
        return typeof body === 'object' ? body.executions : Number(body);
      },
      async close() {
        const codes = await Promise.all(started.map((g) => stop(g.proc)));
        await stop(sim);
        rmSync(dir, { recursive: true, force: true });
        if (codes.some((c) => c !== 0)) throw new Error(`a gateway did not shut down cleanly: ${codes}`);
      },
    };
  } catch (e) {
    await Promise.all(started.map((g) => stop(g.proc)));
    await stop(sim);
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}

/**
 * What an SDK sent and got, attempt by attempt, through the `fetch` it is
 * given: the `Idempotency-Key` of each POST (null if absent), and the
 * status and headers of each answer that came.
 */
export class Wire {
  keys = [];
  answers = [];

  fetch = async (url, init = {}) => {
    const post = (init.method ?? 'GET').toUpperCase() === 'POST';
    if (post) this.keys.push(new Headers(init.headers).get(HEADER));
    const response = await fetch(url, init);
    if (post) this.answers.push({ status: response.status, headers: response.headers });
    return response;
  };

  statuses() {
    return this.answers.map((a) => a.status);
  }
}

/** Polls until the simulator has started the generation for `key`. */
export async function waitUntilRunning(stack, key) {
  for (let i = 0; i < 400; i++) {
    if ((await stack.executionsFor(key)) === 1) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`the first request for ${key} never reached the upstream`);
}

export const MESSAGES = [{ role: 'user', content: 'write the quarterly report' }];
