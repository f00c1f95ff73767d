// The `@anthropic-ai/sdk` TypeScript SDK (version pinned in
// package-lock.json) against the real gateway and simulator.
//
// Up to 0.124.0 this SDK minted `stainless-node-retry-<uuid>` keys like the
// `openai` one, behind the same protected `idempotencyHeader` field; 0.125.0
// removed that code. What it has instead is public: `middleware`, which runs
// per attempt and sees the call's request options (`ctx.options`), the same
// object on every retry of one call. A middleware that mints one key per
// options object gives every call its own key, kept across the SDK's
// retries. These tests fail when either of those changes.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { HEADER, MESSAGES, Wire, startStack, waitUntilRunning } from './harness.mjs';

/** One key per call, kept on every retry of it; a key in `headers` wins. */
const keys = new WeakMap();
const idempotencyKey = async (request, next, ctx) => {
  if (ctx.options && request.method === 'POST' && !request.headers.has(HEADER)) {
    if (!keys.has(ctx.options)) keys.set(ctx.options, `call-${randomUUID()}`);
    request.headers.set(HEADER, keys.get(ctx.options));
  }
  return next(request);
};

let stack;
before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.close();
});

const client = (base, wire, options = {}) =>
  new Anthropic({
    baseURL: base,
    apiKey: 'sk-ant-tenant-ts',
    fetch: wire.fetch,
    middleware: [idempotencyKey],
    ...options,
  });

const ask = (c, headers = {}, body = {}) =>
  c.messages.create({ model: 'sim-claude', max_tokens: 64, messages: MESSAGES, ...body }, { headers });

const freshKey = (what) => `${what}-${randomUUID()}`;

test('no key of its own: idempotencyHeader no longer does anything', async () => {
  // The field the openai SDK still reads. If a release brings it back,
  // this fails and the README's section on this SDK changes.
  class WithHeader extends Anthropic {
    constructor(options) {
      super(options);
      this.idempotencyHeader = HEADER;
    }
  }
  const wire = new Wire();
  await ask(new WithHeader({ baseURL: stack.gateway, apiKey: 'sk-ant-x', fetch: wire.fetch, maxRetries: 0 }));
  assert.deepEqual(wire.keys, [null]);
});

test('a JSON answer is replayed for the same key', async () => {
  const key = freshKey('json');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0, middleware: [] });
  const first = await ask(c, { [HEADER]: key });
  const second = await ask(c, { [HEADER]: key });
  assert.ok(first.content[0].text);
  assert.equal(second.id, first.id);
  assert.equal(await stack.executionsFor(key), 1);
});

test('a stream is replayed event for event', async () => {
  const key = freshKey('stream');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0, middleware: [] });
  const collect = async () => {
    const stream = await ask(c, { [HEADER]: key, 'x-sim-tokens': '40' }, { stream: true });
    const events = [];
    for await (const event of stream) events.push(JSON.stringify(event));
    return events;
  };
  const first = await collect();
  const second = await collect();
  assert.ok(first.length > 40);
  assert.deepEqual(second, first);
  assert.equal(await stack.executionsFor(key), 1);
});

test('the middleware: retries after a client timeout run the generation once', async () => {
  // The client gives up after 1 s; the generation takes 2.5 s.
  const wire = new Wire();
  const c = client(stack.gateway, wire, { timeout: 1000, maxRetries: 4 });
  const answer = await ask(c, { 'x-sim-latency-ms': '2500' });
  assert.ok(answer.content[0].text);
  assert.ok(wire.keys.length >= 2, 'the first attempt must have timed out and been retried');
  const [key] = wire.keys;
  assert.match(key, /^call-/);
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

test("the operation's own key in headers wins over the middleware's", async () => {
  const wire = new Wire();
  const c = client(stack.gateway, wire, { maxRetries: 0 });
  const key = freshKey('report');
  const first = await ask(c, { [HEADER]: key });
  const again = await ask(c, { [HEADER]: key });
  assert.deepEqual(wire.keys, [key, key]);
  assert.equal(again.id, first.id);
  assert.equal(await stack.executionsFor(key), 1);
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
  const send = (content) =>
    c.messages.create(
      { model: 'sim-claude', max_tokens: 64, messages: [{ role: 'user', content }] },
      { headers: { [HEADER]: key } },
    );
  await send('the first request');
  const err = await send('a different request').then(
    () => assert.fail('the reused key must be refused'),
    (e) => e,
  );
  assert.ok(err instanceof Anthropic.UnprocessableEntityError, `got ${err}`);
  assert.equal(err.status, 422);
  assert.equal(err.error.error.type, 'invalid_request_error');
  assert.equal(err.error.error.code, 'key-mismatch');
  assert.match(err.error.error.message, /different request/);
  assert.match(err.message, /different request/);
  assert.equal(await stack.executionsFor(key), 1, 'the second request was not forwarded');
});

test('outcome-unknown on a charging route is an InternalServerError, never a second run', async () => {
  const wire = new Wire();
  const c = client(`${stack.routes}/charging`, wire, { maxRetries: 2 });
  const err = await ask(c, { 'x-sim-fail': 'hang' }).then(
    () => assert.fail('the call must fail'),
    (e) => e,
  );
  assert.ok(err instanceof Anthropic.InternalServerError, `got ${err}`);
  assert.equal(err.status, 504);
  assert.equal(err.error.error.code, 'outcome-unknown');
  assert.equal(err.error.error.type, 'api_error');
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
  assert.ok(again instanceof Anthropic.InternalServerError, `got ${again}`);
  assert.deepEqual(wire.statuses(), [504, 504]);
  assert.equal(wire.answers[1].headers.get('idempotent-replayed'), 'true');
  assert.equal(await stack.executionsFor(key), 1);
});

test('Idempotent-Replayed through withResponse() and asResponse()', async () => {
  const key = freshKey('raw');
  const c = client(stack.gateway, new Wire(), { maxRetries: 0 });
  const first = await ask(c, { [HEADER]: key }).withResponse();
  const second = await ask(c, { [HEADER]: key }).asResponse();
  assert.equal(first.response.headers.get('idempotent-replayed'), 'false');
  assert.equal(second.headers.get('idempotent-replayed'), 'true');
  assert.equal((await second.json()).id, first.data.id);
  assert.equal(await stack.executionsFor(key), 1);
});
