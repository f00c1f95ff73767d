"""The official `openai` and `anthropic` Python clients against the simulator.

Run (needs `pip install openai anthropic`):

    cargo build -p idemgate-llm-sim
    python crates/llm-sim/tests/clients/official_clients.py [path/to/idemgate-llm-sim]

The binary defaults to $CARGO_TARGET_DIR/debug/idemgate-llm-sim (or
target/debug/...). The script starts it on a free port, runs every check,
stops it, and exits non-zero on the first failure.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

import anthropic
import openai


def stats(url):
    with urllib.request.urlopen(f"{url}/sim/stats") as r:
        return json.load(r)


def executions(url, key):
    with urllib.request.urlopen(f"{url}/sim/executions/{key}") as r:
        return json.load(r)["executions"]


def reset(url):
    urllib.request.urlopen(urllib.request.Request(f"{url}/sim/reset", method="POST"))


def raises(kind, fn):
    try:
        fn()
    except AssertionError:
        raise
    except kind as e:
        return e
    raise AssertionError(f"expected {kind}")


def check_openai(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
    messages = [{"role": "user", "content": "what ran twice"}]

    done = client.chat.completions.create(model="gpt-sim", messages=messages)
    assert done.object == "chat.completion"
    assert done.choices[0].finish_reason == "stop"
    text = done.choices[0].message.content
    assert len(text.split()) == 24, text
    assert done.usage.prompt_tokens == 3 and done.usage.completion_tokens == 24
    assert done.usage.total_tokens == 27

    pieces, usage, finish = [], None, None
    for chunk in client.chat.completions.create(
        model="gpt-sim",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text, "stream text = non-streaming text"
    assert len(pieces) == 24 and finish == "stop"
    assert usage.completion_tokens == 24

    with client.chat.completions.stream(model="gpt-sim", messages=messages) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == text

    raw = client.chat.completions.with_raw_response.create(
        model="gpt-sim", messages=messages, extra_headers={"Idempotency-Key": "py-1"}
    )
    assert raw.headers["x-sim-execution"].isdigit()
    assert raw.parse().id != done.id
    assert executions(url, "py-1") == 1

    for fail, kind in [
        ("400", openai.BadRequestError),
        ("429", openai.RateLimitError),
        ("500", openai.InternalServerError),
        ("503", openai.InternalServerError),
    ]:
        err = raises(
            kind,
            lambda: client.chat.completions.create(
                model="gpt-sim", messages=messages, extra_headers={"x-sim-fail": fail}
            ),
        )
        assert "simulated" in str(err), err

    def broken_stream():
        for _ in client.chat.completions.create(
            model="gpt-sim",
            messages=messages,
            stream=True,
            extra_headers={"x-sim-fail": "reset-after:3"},
        ):
            pass

    # The transport's own error type (it differs between httpx releases).
    err = raises(Exception, broken_stream)
    print(f"openai broken stream raised {type(err).__module__}.{type(err).__name__}")

    models = client.models.list()
    assert len(models.data) >= 1

    # A too-short client timeout with the client's own retries: every
    # attempt is a full, billed execution upstream.
    reset(url)
    impatient = openai.OpenAI(
        base_url=f"{url}/v1", api_key="sk-sim", max_retries=2, timeout=0.05
    )
    raises(
        openai.APITimeoutError,
        lambda: impatient.chat.completions.create(
            model="gpt-sim", messages=messages, extra_headers={"x-sim-latency-ms": "300"}
        ),
    )
    return impatient


def check_anthropic(url):
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-sim", max_retries=0)
    messages = [{"role": "user", "content": "hello there"}]

    done = client.messages.create(
        model="claude-sim", max_tokens=100, system="be brief", messages=messages
    )
    assert done.type == "message" and done.stop_reason == "end_turn"
    text = done.content[0].text
    assert len(text.split()) == 24
    assert done.usage.input_tokens == 4 and done.usage.output_tokens == 24

    with client.messages.stream(
        model="claude-sim", max_tokens=100, system="be brief", messages=messages
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.content[0].text == text
    assert final.usage.output_tokens == 24 and final.stop_reason == "end_turn"

    kinds = []
    for event in client.messages.create(
        model="claude-sim", max_tokens=5, messages=messages, stream=True
    ):
        kinds.append(event.type)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert kinds.count("content_block_delta") == 5

    for fail, kind in [
        ("400", anthropic.BadRequestError),
        ("429", anthropic.RateLimitError),
        ("500", anthropic.InternalServerError),
    ]:
        raises(
            kind,
            lambda: client.messages.create(
                model="claude-sim",
                max_tokens=10,
                messages=messages,
                extra_headers={"x-sim-fail": fail},
            ),
        )

    def broken_stream():
        with client.messages.stream(
            model="claude-sim",
            max_tokens=100,
            messages=messages,
            extra_headers={"x-sim-fail": "reset-after:2"},
        ) as stream:
            for _ in stream.text_stream:
                pass

    err = raises(Exception, broken_stream)
    print(f"anthropic broken stream raised {type(err).__module__}.{type(err).__name__}")
    assert len(client.models.list().data) >= 1


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = sys.argv[1] if len(sys.argv) > 1 else f"{target}/debug/idemgate-llm-sim"
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline().strip()
        url = line.removeprefix("listening on ")
        check_openai(url)
        # The timed-out attempts above keep running upstream; wait for them.
        for _ in range(100):
            s = stats(url)
            if s["completed"] == 3:
                break
            time.sleep(0.05)
        assert s["executions"] == 3 and s["completed"] == 3, s
        with urllib.request.urlopen(f"{url}/sim/executions") as r:
            keys = json.load(r)
        print(f"openai {openai.__version__}: ok; 3 timed-out attempts: {s}, keys {keys}")
        check_anthropic(url)
        print(f"anthropic {anthropic.__version__}: ok")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
