// The `openai` TypeScript SDK (version pinned in package-lock.json) against
// the real gateway and simulator.
//
// The SDK mints one key per call, `stainless-node-retry-<uuid>`, before the
// first attempt and keeps it on every automatic retry of that call; it sends
// it only when the client's protected `idempotencyHeader` field names a
// header, which a subclass sets. That field is not public API: these tests
// fail when its behaviour changes, and the README's setting rests on them.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import OpenAI from 'openai';

import { HEADER, MESSAGES, Wire, startStack, waitUntilRunning } from './harness.mjs';

/** The one-line setting: the header the SDK's own key is sent in. */
class ProtectedOpenAI extends OpenAI {
  constructor(options) {
    super(options);
    this.idempotencyHeader = 'Idempotency-Key';
  }
}

let stack;
before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.close();
});

const client = (base, wire, options = {}, Class = ProtectedOpenAI) =>
  new Class({ baseURL: `${base}/v1`, apiKey: 'sk-tenant-ts', fetch: wire.fetch, ...options });

const ask = (c, headers = {}, body = {}) =>
  c.chat.completions.create({ model: 'sim-1', messages: MESSAGES, ...body }, { headers });

const freshKey = (what) => `${what}-${randomUUID()}`;

test('the header ships unset: no key without the setting', async () => {
  const wire = new Wire();
  await ask(client(stack.gateway, wire, { maxRetries: 0 }, OpenAI));
  assert.deepEqual(wire.keys, [null]);
});

test('a JSON answer is replayed for the same key', async () => {
  const key = freshKey('json');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0 }, OpenAI);
  const first = await ask(c, { [HEADER]: key });
  const second = await ask(c, { [HEADER]: key });
  assert.ok(first.choices[0].message.content);
  assert.equal(second.id, first.id);
  assert.equal(await stack.executionsFor(key), 1);
});

test('a stream is replayed chunk for chunk', async () => {
  const key = freshKey('stream');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0 }, OpenAI);
  const collect = async () => {
    const stream = await ask(
      c,
      { [HEADER]: key, 'x-sim-tokens': '40' },
      { stream: true, stream_options: { include_usage: true } },
    );
    const chunks = [];
    for await (const chunk of stream) chunks.push(JSON.stringify(chunk));
    return chunks;
  };
  const first = await collect();
  const second = await collect();
  assert.ok(first.length > 40);
  assert.deepEqual(second, first);
  assert.equal(await stack.executionsFor(key), 1);
});

test('the one-line setting: retries after a client timeout run the generation once', async () => {
  // The client gives up after 1 s; the generation takes 2.5 s.
  const wire = new Wire();
  const c = client(stack.gateway, wire, { timeout: 1000, maxRetries: 4 });
  const answer = await ask(c, { 'x-sim-latency-ms': '2500' });
  assert.ok(answer.choices[0].message.content);
  assert.ok(wire.keys.length >= 2, 'the first attempt must have timed out and been retried');
  const [key] = wire.keys;
  assert.match(key, /^stainless-node-retry-/);
  assert.deepEqual(new Set(wire.keys), new Set([key]), 'every retry of one call carries the same key');
  assert.equal(await stack.executionsFor(key), 1, 'the retries must not run the generation again');
});

test('a second call is a new key: application-level retries need their own', async () => {
  const wire = new Wire();
  const c = client(stack.gateway, wire, { maxRetries: 0 });
  await ask(c);
  await ask(c);
  const [first, second] = wire.keys;
  assert.notEqual(first, second);
  assert.equal(await stack.executionsFor(first), 1);
  assert.equal(await stack.executionsFor(second), 1);
});

test("the operation's own key in headers wins over the SDK's", async () => {
  const wire = new Wire();
  const c = client(stack.gateway, wire, { maxRetries: 0 });
  const key = freshKey('report');
  const first = await ask(c, { [HEADER]: key });
  const again = await ask(c, { [HEADER]: key });
  assert.deepEqual(wire.keys, [key, key]);
  assert.equal(again.id, first.id);
  assert.equal(await stack.executionsFor(key), 1);
});

test('withOptions() keeps the setting of a subclass', async () => {
  const wire = new Wire();
  await ask(client(stack.gateway, wire, { maxRetries: 0 }).withOptions({ timeout: 30_000 }));
  assert.match(wire.keys[0], /^stainless-node-retry-/);
});

test('a 409 while in flight is retried by the SDK, as retry-after-ms says', async () => {
  const key = freshKey('inflight');
  const base = `${stack.routes}/reject`;
  const headers = { [HEADER]: key, 'x-sim-latency-ms': '2500' };
  const owner = ask(client(base, new Wire(), { maxRetries: 0 }), headers);
  await waitUntilRunning(stack, key);

  const wire = new Wire();
  const { data, response } = await ask(client(base, wire, { maxRetries: 8 }), headers).withResponse();
  const first = await owner;

  const statuses = wire.statuses();
  assert.equal(statuses[0], 409);
  assert.equal(statuses.at(-1), 200);
  assert.ok(Number(wire.answers[0].headers.get('retry-after-ms')) > 0);
  assert.equal(wire.answers[0].headers.get('x-should-retry'), 'true');
  assert.equal(response.headers.get('idempotent-replayed'), 'true');
  assert.equal(data.id, first.id);
  assert.equal(await stack.executionsFor(key), 1);
});

test('a key reused for a different request is an UnprocessableEntityError that says so', async () => {
  const key = freshKey('reuse');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0 });
  await c.chat.completions.create(
    { model: 'sim-1', messages: [{ role: 'user', content: 'the first request' }] },
    { headers: { [HEADER]: key } },
  );
  const err = await c.chat.completions
    .create(
      { model: 'sim-1', messages: [{ role: 'user', content: 'a different request' }] },
      { headers: { [HEADER]: key } },
    )
    .then(
      () => assert.fail('the reused key must be refused'),
      (e) => e,
    );
  assert.ok(err instanceof OpenAI.UnprocessableEntityError, `got ${err}`);
  assert.equal(err.status, 422);
  assert.equal(err.type, 'invalid_request_error');
  assert.equal(err.code, 'key-mismatch');
  assert.match(err.error.message, /different request/);
  assert.match(err.message, /different request/);
  assert.equal(await stack.executionsFor(key), 1, 'the second request was not forwarded');
});

test('outcome-unknown on a charging route is an InternalServerError, never a second run', async () => {
  // The upstream took the request and never answered: the work may have
  // run. The SDK's retries (same key) get the stored 504 again.
  const wire = new Wire();
  const c = client(`${stack.routes}/charging`, wire, { maxRetries: 2 });
  const err = await ask(c, { 'x-sim-fail': 'hang' }).then(
    () => assert.fail('the call must fail'),
    (e) => e,
  );
  assert.ok(err instanceof OpenAI.InternalServerError, `got ${err}`);
  assert.equal(err.status, 504);
  assert.equal(err.code, 'outcome-unknown');
  assert.equal(err.type, 'api_error');
  assert.match(err.message, /may have run/);
  const [key] = wire.keys;
  // A final answer (x-should-retry: false): the SDK does not retry it.
  assert.deepEqual(wire.keys, [key], 'a final answer is not retried');
  assert.equal(wire.answers[0].headers.get('x-should-retry'), 'false');
  // A later call with the same key gets it replayed, never a second run.
  const again = await ask(c, { 'x-sim-fail': 'hang', [HEADER]: key }).then(
    () => assert.fail('the call must fail'),
    (e) => e,
  );
  assert.ok(again instanceof OpenAI.InternalServerError, `got ${again}`);
  assert.deepEqual(wire.statuses(), [504, 504]);
  assert.equal(wire.answers[1].headers.get('idempotent-replayed'), 'true');
  assert.equal(await stack.executionsFor(key), 1);
});

test('Idempotent-Replayed through withResponse() and asResponse()', async () => {
  const key = freshKey('raw');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0 }, OpenAI);
  const first = await ask(c, { [HEADER]: key }).withResponse();
  const second = await ask(c, { [HEADER]: key }).asResponse();
  assert.equal(first.response.headers.get('idempotent-replayed'), 'false');
  assert.equal(second.headers.get('idempotent-replayed'), 'true');
  assert.equal((await second.json()).id, first.data.id);
  assert.equal(await stack.executionsFor(key), 1);
});
