"""Refusals as the official SDKs show them.

The gateway's problems (RFC 9457) also carry an `error` object: the `openai`
client reads `body.get("error", body)`, the `anthropic` client keeps the
body whose `error.message` it shows. A key reused for a different request
must surface as an error that says so, not as a bare status code.
"""

import uuid

import anthropic
import openai
import pytest


def test_openai_shows_a_reused_key_as_a_422_that_says_so(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-tenant-a", timeout=30, max_retries=0)
    client.chat.completions.create(
        model="sim-1",
        messages=[{"role": "user", "content": "the first request"}],
        extra_headers={"Idempotency-Key": key},
    )
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(
            model="sim-1",
            messages=[{"role": "user", "content": "a different request"}],
            extra_headers={"Idempotency-Key": key},
        )
    err = caught.value
    assert err.status_code == 422
    assert err.code == "key-mismatch"
    assert err.type == "invalid_request_error"
    assert "different request" in err.body["message"]
    assert "different request" in str(err)
    assert sim.executions_for(key) == 1, "the second request was not forwarded"


def test_anthropic_shows_a_reused_key_in_error_message(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-e", timeout=30, max_retries=0)

    def send(text):
        return client.messages.create(
            model="sim-1",
            max_tokens=64,
            messages=[{"role": "user", "content": text}],
            extra_headers={"Idempotency-Key": key},
        )

    send("the first request")
    with pytest.raises(anthropic.UnprocessableEntityError) as caught:
        send("a different request")
    err = caught.value
    assert err.status_code == 422
    assert err.body["error"]["type"] == "invalid_request_error"
    assert err.body["error"]["code"] == "key-mismatch"
    assert "different request" in err.body["error"]["message"]
    assert "different request" in err.message
    assert sim.executions_for(key) == 1
