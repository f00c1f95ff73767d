"""Token pacing of streamed answers, as a kept-alive client sees it.

Sends STREAMS streamed chat completions one after the other on one client
(so on one kept-alive connection, as an application does), each with a new
Idempotency-Key. CLIENT is `openai` (the official client) or `socket` (HTTP/1.1
written on a plain socket and read as bytes arrive: a minimal reader that
ACKs late, which is how a missing TCP_NODELAY on the server shows). Prints,
in `key=value` form:

- ttft_*: time from sending the request to the first chunk;
- gap_*: time between consecutive chunks of a stream;
- worst_gap_p50: the median over streams of each stream's longest gap.

Against the simulator (`--token-interval-ms 10`), the gaps should stay at
the interval: a proxy that delays an event (Nagle's algorithm waiting for a
delayed ACK, buffering) shows as a worst gap far above it.

Usage: stream_gaps.py LABEL BASE_URL STREAMS CLIENT
"""

import json
import socket
import statistics
import sys
import time
import uuid
from urllib.parse import urlsplit

MESSAGES = [{"role": "user", "content": "hello"}]


def openai_streams(base, streams):
    """Yields each stream's chunk arrival times, from the openai client."""
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-bench", max_retries=0, timeout=30)
    for _ in range(streams):
        sent = time.monotonic()
        arrivals = []
        for _chunk in client.chat.completions.create(
            model="sim-1",
            messages=MESSAGES,
            stream=True,
            extra_headers={"Idempotency-Key": str(uuid.uuid4())},
        ):
            arrivals.append(time.monotonic())
        yield sent, arrivals


def socket_streams(base, streams):
    """Yields each stream's read times, from one kept-alive socket."""
    url = urlsplit(base)
    # An answer that is not a stream (an error) would never show [DONE].
    sock = socket.create_connection((url.hostname, url.port or 80), timeout=30)
    body = json.dumps({"model": "sim-1", "stream": True, "messages": MESSAGES}).encode()
    try:
        for _ in range(streams):
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
                "Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n"
                f"Idempotency-Key: {uuid.uuid4()}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sent = time.monotonic()
            sock.sendall(head.encode() + body)
            arrivals, received = [], b""
            # The answer is chunked; it ends with the last chunk after [DONE].
            while not (b"[DONE]" in received and received.endswith(b"0\r\n\r\n")):
                data = sock.recv(65536)
                if not data:
                    raise SystemExit("the connection closed mid-stream")
                if b"data:" in data:  # not the head alone, nor the last chunk
                    arrivals.append(time.monotonic())
                received += data
            yield sent, arrivals
    finally:
        sock.close()


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def main():
    readers = {"openai": openai_streams, "socket": socket_streams}
    if len(sys.argv) != 5 or not sys.argv[3].isdigit() or sys.argv[4] not in readers:
        sys.exit("usage: stream_gaps.py LABEL BASE_URL STREAMS openai|socket")
    label, base, streams, client = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    runs = readers[client](base, streams)
    ttfts, gaps, worst = [], [], []
    for sent, arrivals in runs:
        if not arrivals:
            print(f"label={label} error=empty-stream")
            sys.exit(1)
        ttfts.append((arrivals[0] - sent) * 1000)
        stream_gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
        gaps.extend(stream_gaps)
        worst.append(max(stream_gaps, default=0.0))
    ttfts.sort()
    gaps.sort()
    print(
        f"label={label} client={client} streams={streams} chunks={len(gaps) + streams}"
        f" ttft_p50_ms={quantile(ttfts, 0.5):.2f} ttft_p99_ms={quantile(ttfts, 0.99):.2f}"
        f" gap_p50_ms={quantile(gaps, 0.5):.2f} gap_p99_ms={quantile(gaps, 0.99):.2f}"
        f" gap_max_ms={gaps[-1]:.2f} worst_gap_p50_ms={statistics.median(worst):.2f}"
    )


if __name__ == "__main__":
    main()
