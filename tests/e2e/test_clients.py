"""The official clients, pointed at the gateway, retrying on timeouts.

The timeout story: the client's timeout is shorter than the generation, the
client retries with the same key, and the upstream still runs once.
"""

import uuid

import anthropic
import openai

MESSAGES = [{"role": "user", "content": "write the quarterly report"}]


def test_openai_timeout_shorter_than_generation_runs_once(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-tenant-a", timeout=0.5, max_retries=5)
    completion = client.chat.completions.create(
        model="sim-1",
        messages=MESSAGES,
        extra_headers={"Idempotency-Key": key, "x-sim-latency-ms": "1500"},
    )
    assert completion.choices[0].message.content
    assert completion.usage.completion_tokens > 0
    assert sim.executions_for(key) == 1, "the retries must not run the generation again"

    # Without idemgate's key the same client would have paid for every attempt:
    # the first attempt alone already timed out, so at least two were sent.
    again = client.chat.completions.with_raw_response.create(
        model="sim-1", messages=MESSAGES, extra_headers={"Idempotency-Key": key}
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().id == completion.id
    assert sim.executions_for(key) == 1


def test_openai_stream_is_replayed_identically(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-tenant-a", timeout=30, max_retries=0)

    def collect():
        chunks = client.chat.completions.create(
            model="sim-1",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"Idempotency-Key": key, "x-sim-tokens": "40"},
        )
        return [c.model_dump_json() for c in chunks]

    first = collect()
    second = collect()
    assert len(first) > 40
    assert first == second, "the replayed stream must equal the original chunk for chunk"
    assert sim.executions_for(key) == 1


def test_anthropic_messages_replayed(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-b", timeout=30, max_retries=2)

    def ask():
        return client.messages.create(
            model="sim-claude",
            max_tokens=64,
            messages=MESSAGES,
            extra_headers={"Idempotency-Key": key},
        )

    first = ask()
    second = ask()
    assert first.content[0].text
    assert first.usage.output_tokens > 0
    assert second.id == first.id
    assert sim.executions_for(key) == 1


def test_anthropic_stream_replayed(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-b", timeout=30, max_retries=0)

    def stream_text():
        with client.messages.stream(
            model="sim-claude",
            max_tokens=64,
            messages=MESSAGES,
            extra_headers={"Idempotency-Key": key},
        ) as s:
            return "".join(s.text_stream), s.get_final_message().id

    assert stream_text() == stream_text()
    assert sim.executions_for(key) == 1


def test_tenants_do_not_share_results(gateway, sim):
    key = f"e2e-{uuid.uuid4()}"
    a = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-tenant-a", max_retries=0)
    b = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-tenant-b", max_retries=0)
    ra = a.chat.completions.create(model="sim-1", messages=MESSAGES, extra_headers={"Idempotency-Key": key})
    rb = b.chat.completions.create(model="sim-1", messages=MESSAGES, extra_headers={"Idempotency-Key": key})
    assert ra.id != rb.id
    assert sim.executions_for(key) == 2


def test_anthropic_tenants_do_not_share_results(gateway, sim):
    # The official client sends its key in `x-api-key`, not `Authorization`.
    key = f"e2e-{uuid.uuid4()}"
    a = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-a", max_retries=0)
    b = anthropic.Anthropic(base_url=gateway, api_key="sk-ant-tenant-b", max_retries=0)

    def ask(client):
        return client.messages.create(
            model="sim-claude", max_tokens=64, messages=MESSAGES, extra_headers={"Idempotency-Key": key}
        )

    ra, rb = ask(a), ask(b)
    assert ra.id != rb.id
    assert sim.executions_for(key) == 2
    assert ask(a).id == ra.id
    assert sim.executions_for(key) == 2
