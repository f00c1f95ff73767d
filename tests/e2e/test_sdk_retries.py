"""The SDKs' own idempotency key, turned on with one line.

The `openai` and `anthropic` Python clients mint one key per call,
`stainless-python-retry-<uuid>`, before the first attempt, and keep it on
every automatic retry of that call; they send it only when the client's
`_idempotency_header` names a header. That attribute is not public, so these
tests pin the SDK versions (requirements.txt) and fail when its behaviour
changes: the README's one-line setting rests on them.

Every attempt is observed on the wire through the SDK's `http_client`
hooks: which key it carried, which status it got.
"""

import threading
import time
import uuid

import anthropic
import openai
import pytest

MESSAGES = [{"role": "user", "content": "write the quarterly report"}]
HEADER = "Idempotency-Key"


class Wire:
    """What the SDK sent and got, attempt by attempt."""

    def __init__(self):
        self.keys = []  # the Idempotency-Key of each attempt (None if absent)
        self.answers = []  # (status, headers) of each answer that came

    def client(self, sdk):
        def on_request(request):
            if request.method == "POST":
                self.keys.append(request.headers.get(HEADER))

        def on_response(response):
            if response.request.method == "POST":
                self.answers.append((response.status_code, response.headers))

        return sdk.DefaultHttpxClient(event_hooks={"request": [on_request], "response": [on_response]})

    def statuses(self):
        return [status for status, _ in self.answers]


def openai_client(base, wire, **kw):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-tenant-sdk", http_client=wire.client(openai), **kw)
    client._idempotency_header = HEADER  # the one line
    return client


def anthropic_client(base, wire, **kw):
    client = anthropic.Anthropic(base_url=base, api_key="sk-ant-tenant-sdk", http_client=wire.client(anthropic), **kw)
    client._idempotency_header = HEADER  # the one line
    return client


def ask_openai(client, extra=None, **kw):
    return client.chat.completions.create(model="sim-1", messages=MESSAGES, extra_headers=extra or {}, **kw)


def ask_anthropic(client, extra=None, **kw):
    return client.messages.create(
        model="sim-claude", max_tokens=64, messages=MESSAGES, extra_headers=extra or {}, **kw
    )


SDKS = {
    "openai": (openai_client, ask_openai, lambda r: r.choices[0].message.content),
    "anthropic": (anthropic_client, ask_anthropic, lambda r: r.content[0].text),
}


@pytest.mark.parametrize("sdk", SDKS)
def test_the_header_ships_unset(gateway, sdk):
    # Without the one line the SDKs send no key: the gateway cannot protect
    # their retries. If a release starts sending one, the README changes.
    _, ask, _ = SDKS[sdk]
    wire = Wire()
    if sdk == "openai":
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-x", http_client=wire.client(openai), max_retries=0)
    else:
        client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-x", http_client=wire.client(anthropic), max_retries=0)
    assert client._idempotency_header is None
    ask(client)
    assert wire.keys == [None]


@pytest.mark.parametrize("sdk", SDKS)
def test_one_line_makes_timeout_retries_run_once(gateway, sim, sdk):
    # The client gives up after 1 s; the generation takes 2.5 s. Every
    # retry carries the key the SDK minted for the call, so the gateway
    # runs the generation once and hands the retry its answer.
    make, ask, text = SDKS[sdk]
    wire = Wire()
    client = make(gateway, wire, timeout=1, max_retries=4)
    answer = ask(client, {"x-sim-latency-ms": "2500"})
    assert text(answer)
    assert len(wire.keys) >= 2, "the first attempt must have timed out and been retried"
    key = wire.keys[0]
    assert key.startswith("stainless-python-retry-")
    assert set(wire.keys) == {key}, "every retry of one call carries the same key"
    assert sim.executions_for(key) == 1, "the retries must not run the generation again"


@pytest.mark.parametrize("sdk", SDKS)
def test_a_second_call_is_a_new_key(gateway, sim, sdk):
    # An application that retries by calling again makes a new call, and
    # the SDK mints a new key for it: the one line does not cover that.
    make, ask, _ = SDKS[sdk]
    wire = Wire()
    client = make(gateway, wire, max_retries=0)
    ask(client)
    ask(client)
    first, second = wire.keys
    assert first != second
    assert sim.executions_for(first) == 1
    assert sim.executions_for(second) == 1


@pytest.mark.parametrize("sdk", SDKS)
def test_the_operations_own_key_wins(gateway, sim, sdk):
    # For application-level retries the key comes from the operation, in
    # extra_headers; with the one line set as well, it is the one sent.
    make, ask, _ = SDKS[sdk]
    wire = Wire()
    client = make(gateway, wire, max_retries=0)
    key = f"report-{uuid.uuid4()}"
    first = ask(client, {HEADER: key})
    again = ask(client, {HEADER: key})
    assert wire.keys == [key, key]
    assert again.id == first.id
    assert sim.executions_for(key) == 1


@pytest.mark.parametrize("sdk", SDKS)
def test_with_options_returns_a_client_without_the_setting(gateway, sdk):
    # `with_options()` / `copy()` build a new client: the attribute set on
    # the old one is not carried over, a subclass that sets it is.
    make, ask, _ = SDKS[sdk]
    wire = Wire()
    client = make(gateway, wire, max_retries=0)
    ask(client.with_options(timeout=30))
    assert wire.keys == [None]

    module = openai if sdk == "openai" else anthropic
    url = f"{gateway}/v1" if sdk == "openai" else gateway

    class Protected(type(client)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._idempotency_header = HEADER

    protected = Protected(base_url=url, api_key="sk-sub", http_client=wire.client(module), max_retries=0)
    ask(protected.with_options(timeout=30))
    assert wire.keys[1].startswith("stainless-python-retry-")


def _wait_until_running(sim, key):
    for _ in range(400):
        if sim.executions_for(key) == 1:
            return
        time.sleep(0.025)
    raise AssertionError(f"the first request for {key} never reached the upstream")


@pytest.mark.parametrize("sdk", SDKS)
def test_409_in_flight_is_retried_by_the_sdk(routes, sim, sdk):
    # On a route with on_inflight = "reject", a duplicate of a running key
    # gets 409 with retry-after-ms and x-should-retry: true; the SDK's own
    # retry loop waits as told and comes back for the stored answer.
    make, ask, _ = SDKS[sdk]
    key = f"inflight-{uuid.uuid4()}"
    base = f"{routes}/reject"
    first = {}

    def owner():
        first["answer"] = ask(make(base, Wire(), timeout=30, max_retries=0), {HEADER: key, "x-sim-latency-ms": "2500"})

    running = threading.Thread(target=owner)
    running.start()
    _wait_until_running(sim, key)

    wire = Wire()
    duplicate = make(base, wire, timeout=30, max_retries=8)
    raw = (duplicate.chat.completions if sdk == "openai" else duplicate.messages).with_raw_response
    if sdk == "openai":
        answer = raw.create(model="sim-1", messages=MESSAGES, extra_headers={HEADER: key, "x-sim-latency-ms": "2500"})
    else:
        answer = raw.create(
            model="sim-claude",
            max_tokens=64,
            messages=MESSAGES,
            extra_headers={HEADER: key, "x-sim-latency-ms": "2500"},
        )
    running.join()

    assert wire.statuses()[0] == 409
    assert wire.statuses()[-1] == 200
    conflict = wire.answers[0][1]
    assert int(conflict["retry-after-ms"]) > 0
    assert conflict["x-should-retry"] == "true"
    assert answer.headers["idempotent-replayed"] == "true"
    assert answer.parse().id == first["answer"].id
    assert sim.executions_for(key) == 1


def test_openai_outcome_unknown_is_a_typed_error(routes, sim):
    # On a charging route the upstream took the request and never answered:
    # the work may have run. The gateway keeps a final 504 outcome-unknown
    # answer marked x-should-retry: false, so the SDK does not spend its
    # retries on it; a later call with the same key gets it replayed, never
    # a second run.
    wire = Wire()
    client = openai_client(f"{routes}/charging", wire, timeout=30, max_retries=2)
    with pytest.raises(openai.InternalServerError) as caught:
        ask_openai(client, {"x-sim-fail": "hang"})
    err = caught.value
    assert err.status_code == 504
    assert err.code == "outcome-unknown"
    assert err.type == "api_error"
    assert "may have run" in err.message
    key = wire.keys[0]
    assert wire.keys == [key], "a final answer is not retried"
    assert wire.answers[0][1]["x-should-retry"] == "false"
    with pytest.raises(openai.InternalServerError) as again:
        ask_openai(client, {"x-sim-fail": "hang", HEADER: key})
    assert again.value.code == "outcome-unknown"
    assert wire.statuses() == [504, 504]
    assert wire.answers[1][1]["idempotent-replayed"] == "true"
    assert wire.answers[1][1]["x-should-retry"] == "false"
    assert sim.executions_for(key) == 1


def test_anthropic_outcome_unknown_is_a_typed_error(routes, sim):
    wire = Wire()
    client = anthropic_client(f"{routes}/charging", wire, timeout=30, max_retries=2)
    with pytest.raises(anthropic.InternalServerError) as caught:
        ask_anthropic(client, {"x-sim-fail": "hang"})
    err = caught.value
    assert err.status_code == 504
    assert err.body["error"]["code"] == "outcome-unknown"
    assert err.body["error"]["type"] == "api_error"
    assert "may have run" in err.message
    key = wire.keys[0]
    assert wire.keys == [key], "a final answer is not retried"
    with pytest.raises(anthropic.InternalServerError):
        ask_anthropic(client, {"x-sim-fail": "hang", HEADER: key})
    assert wire.statuses() == [504, 504]
    assert wire.answers[1][1]["idempotent-replayed"] == "true"
    assert sim.executions_for(key) == 1


def _openai_stream_text(client, key):
    """The text deltas a broken stream yields, and the error it ends with."""
    texts = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in ask_openai(client, {"x-sim-fail": "reset-after:3", HEADER: key}, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
    return texts, caught.value


def test_openai_broken_stream_is_its_partial_answer(routes, sim):
    # On a charging route the upstream cut the stream after 3 tokens: the
    # generation may have run whole, and billed. The stored answer is the
    # stream as relayed, then an error event naming outcome-unknown and the
    # counts; the SDK yields the partial text, then raises it. The same
    # call again gets the same text and error, and nothing runs again.
    wire = Wire()
    client = openai_client(f"{routes}/charging", wire, timeout=30, max_retries=2)
    key = f"e2e-{uuid.uuid4()}"
    texts, err = _openai_stream_text(client, key)
    assert len(texts) == 3
    assert err.code == "outcome-unknown"
    assert err.type == "api_error"
    assert err.body["events"] == 4 and err.body["tokens"] == 3
    assert "may have run" in err.message
    again, err2 = _openai_stream_text(client, key)
    assert again == texts, "never the first half twice, never another run"
    assert err2.body == err.body
    assert wire.statuses() == [200, 200]
    assert wire.answers[1][1]["idempotent-replayed"] == "true"
    assert sim.executions_for(key) == 1


def _anthropic_stream_text(client, key):
    texts = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in ask_anthropic(client, {"x-sim-fail": "reset-after:3", HEADER: key}, stream=True):
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
    return texts, caught.value


def test_anthropic_broken_stream_is_its_partial_answer(routes, sim):
    wire = Wire()
    client = anthropic_client(f"{routes}/charging", wire, timeout=30, max_retries=2)
    key = f"e2e-{uuid.uuid4()}"
    texts, err = _anthropic_stream_text(client, key)
    assert len(texts) == 3
    assert err.body["error"]["code"] == "outcome-unknown"
    assert err.body["error"]["tokens"] == 3
    again, err2 = _anthropic_stream_text(client, key)
    assert again == texts
    assert err2.body == err.body
    assert wire.statuses() == [200, 200]
    assert wire.answers[1][1]["idempotent-replayed"] == "true"
    assert sim.executions_for(key) == 1


def test_anthropic_raw_response_shows_the_replay(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-raw", max_retries=0)

    def ask():
        return client.messages.with_raw_response.create(
            model="sim-claude", max_tokens=64, messages=MESSAGES, extra_headers={HEADER: key}
        )

    first, second = ask(), ask()
    assert first.headers["idempotent-replayed"] == "false"
    assert second.headers["idempotent-replayed"] == "true"
    assert second.parse().id == first.parse().id
    assert sim.executions_for(key) == 1
