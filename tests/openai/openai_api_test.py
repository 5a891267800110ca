#!/usr/bin/env python3
"""The OpenAI-compatible API end to end: a real chunkserve-worker serving SmolLM2-135M-Instruct
(the GGUF .ci/fetch-models caches) and a real chunkserve-router in front of it, talked to with the
official `openai` Python package and with curl.

  openai_api_test.py BIN_DIR

Checks: /v1/models; chat and completions, streaming and not, through the worker and through the
router (greedy answers equal on both paths and between stream and non-stream); n choices (each
sampled with its own seed, streamed by index, usage summed); usage with cached
prompt tokens; stop strings; bad requests (400 with OpenAI's error shape and the offending param);
an unknown model (404); the API key (401 without it); a wire port with TLS and a cluster secret
behind the API; a client that disconnects mid-stream (the request is cancelled upstream and its KV
chunks are released).

Exits 77 (ctest: skipped) when the model or the `openai` package is missing, saying why.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


try:
    import openai
except ImportError:
    skip("the `openai` package is not installed (bash .ci/python-deps)")

CACHE = os.environ.get("CHUNKSERVE_MODEL_CACHE",
                       os.path.expanduser("~/.cache/chunkserve/models"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.exists(MODEL):
    skip(f"{MODEL} is missing (bash .ci/fetch-models)")

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
NAME = "smollm2"
SYSTEM = ("You are a concise assistant for a company that makes bicycles. You answer questions "
          "about frames, wheels, gears and brakes. Keep every answer under three sentences.")


class Proc:
    """A server process whose stdout announces its ports."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        self.ports = {}
        deadline = time.time() + 60
        while time.time() < deadline and not {"listening", "http"} <= self.ports.keys():
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[0]} exited: {self.p.stderr.read()[-2000:]}")
            m = re.match(r"(listening|http) on ([\d.]+):(\d+)", line)
            if m:
                self.ports[m.group(1)] = int(m.group(3))
        if not {"listening", "http"} <= self.ports.keys():
            raise RuntimeError(f"{argv[0]} did not announce its ports")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.ports['http']}"

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for(what, predicate, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def curl(*args):
    r = subprocess.run(["curl", "-sS", "-m", "60", "-w", "\n%{http_code}", *args],
                       capture_output=True, text=True, check=True)
    body, _, code = r.stdout.rpartition("\n")
    return int(code), body


checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def chat(client, user, **kw):
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": user}],
        **{"temperature": 0, "max_tokens": 32, **kw})


def stream_text(stream):
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)
            text += (delta.content or "") if delta is not None else (choice.text or "")
            finish = choice.finish_reason or finish
    return text, finish, usage


def api_checks(url, label, key="unused"):
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    models = client.models.list()
    check([m.id for m in models.data] == [NAME], f"{label}: /v1/models lists {NAME}")

    a = chat(client, "What does a derailleur do?")
    answer = a.choices[0].message.content
    check(len(answer) > 0 and a.choices[0].finish_reason in ("stop", "length"),
          f"{label}: chat answers ({a.usage.completion_tokens} tokens): {answer[:60]!r}")
    check(a.usage.prompt_tokens > 40 and a.usage.total_tokens ==
          a.usage.prompt_tokens + a.usage.completion_tokens, f"{label}: chat usage adds up")

    b = chat(client, "How often should I replace brake pads?")
    cached = b.usage.prompt_tokens_details.cached_tokens
    check(cached > 0, f"{label}: the shared system prompt is cached ({cached} tokens)")

    text, finish, usage = stream_text(chat(client, "What does a derailleur do?", stream=True,
                                           stream_options={"include_usage": True}))
    check(text == answer, f"{label}: streamed chat equals the non-streamed answer")
    check(finish == a.choices[0].finish_reason and usage is not None and
          usage.completion_tokens == a.usage.completion_tokens,
          f"{label}: streamed finish reason and usage match")

    logprobs = logprobs_checks(client, label, answer)

    c = client.completions.create(model=NAME, prompt="The three primary colors are",
                                  temperature=0, max_tokens=24)
    ctext = c.choices[0].text
    check(len(ctext) > 0, f"{label}: completion: {ctext[:60]!r}")
    stext, _, _ = stream_text(client.completions.create(
        model=NAME, prompt="The three primary colors are", temperature=0, max_tokens=24,
        stream=True))
    check(stext == ctext, f"{label}: streamed completion equals the non-streamed one")

    # A stop string cuts the text where it begins.
    words = ctext.split()
    if len(words) >= 3:
        stop = " " + words[2]
        s = client.completions.create(model=NAME, prompt="The three primary colors are",
                                      temperature=0, max_tokens=24, stop=[stop])
        check(s.choices[0].finish_reason == "stop" and stop not in s.choices[0].text and
              ctext.startswith(s.choices[0].text), f"{label}: stop string {stop!r} cuts the text")

    # Seeded sampling is reproducible.
    kw = dict(model=NAME, prompt="Once upon a time", temperature=0.9, max_tokens=16, seed=7)
    check(client.completions.create(**kw).choices[0].text ==
          client.completions.create(**kw).choices[0].text, f"{label}: a seed makes sampling repeat")

    try:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                       temperature=5)
        check(False, f"{label}: temperature 5 is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "temperature",
              f"{label}: temperature 5 is refused with 400 naming the param")
    try:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
        check(False, f"{label}: an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"{label}: an unknown model gets 404")

    # curl: the same answer; malformed JSON; an unknown path.
    body = json.dumps({"model": NAME, "temperature": 0, "max_tokens": 32,
                       "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "What does a derailleur do?"}]})
    auth = ["-H", f"Authorization: Bearer {key}"]
    code, out = curl(*auth, "-H", "Content-Type: application/json", "-d", body,
                     url + "/v1/chat/completions")
    check(code == 200 and json.loads(out)["choices"][0]["message"]["content"] == answer,
          f"{label}: curl gets the same answer")
    code, out = curl(*auth, "-H", "Content-Type: application/json", "-d", "{not json",
                     url + "/v1/chat/completions")
    check(code == 400 and "error" in json.loads(out), f"{label}: malformed JSON gets 400")
    code, out = curl(*auth, url + "/v1/nothing")
    check(code == 404 and "error" in json.loads(out), f"{label}: unknown path gets 404")
    code, out = curl(*auth, "-N", "-H", "Content-Type: application/json", "-d",
                     json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 8,
                                 "temperature": 0, "stream": True}),
                     url + "/v1/completions")
    events = [l for l in out.splitlines() if l.startswith("data: ")]
    check(code == 200 and events[-1] == "data: [DONE]" and len(events) >= 3,
          f"{label}: curl reads the event stream ({len(events)} events)")
    return answer, logprobs


def logprobs_checks(client, label, answer):
    """Logprobs on chat (plain and streamed) and completions; returns chat's per-token list."""
    a = chat(client, "What does a derailleur do?", logprobs=True, top_logprobs=3)
    content = a.choices[0].logprobs.content
    check(a.choices[0].message.content == answer, f"{label}: asking for logprobs changes no text")
    check(b"".join(bytes(e.bytes) for e in content) == answer.encode(),
          f"{label}: the {len(content)} logprob entries' bytes add up to the answer")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token and
              e.top_logprobs[0].logprob == e.logprob and e.logprob <= 0 and
              e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob for e in content),
          f"{label}: greedy tokens are their position's most likely, with 3 alternatives each")
    streamed = []
    for chunk in chat(client, "What does a derailleur do?", logprobs=True, top_logprobs=3,
                      stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                streamed.extend(choice.logprobs.content)
    check([(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content],
          f"{label}: streamed logprobs equal the non-streamed ones")
    c = client.completions.create(model=NAME, prompt="The three primary colors are",
                                  temperature=0, max_tokens=12, logprobs=2)
    lp = c.choices[0].logprobs
    offsets = lp.text_offset
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(offsets) and
          offsets[0] == 0 and offsets == sorted(offsets) and
          all(len(t) <= 2 for t in lp.top_logprobs),
          f"{label}: completions logprobs: tokens, token_logprobs, top_logprobs, text_offset")
    return [(e.token, e.logprob) for e in content]


def disconnect_check(url, worker_url, label, n=1):
    """Reads two events of a long stream (of n choices), then closes the socket."""
    before = metrics(url).get("chunkserve_http_disconnects_total", 0)
    body = json.dumps({"model": NAME, "prompt": "Write a long story about a dragon.", "n": n,
                       "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True})
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer unused\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    got = b""
    while got.count(b"data: ") < 2:
        data = s.recv(4096)
        if not data:
            break
        got += data
    check(got.startswith(b"HTTP/1.1 200"), f"{label}: the stream started")
    wait_for("the request to run", lambda: metrics(worker_url).get("chunkserve_running", 0) >= 1)
    s.close()
    wait_for("the disconnect to be counted",
             lambda: metrics(url).get("chunkserve_http_disconnects_total", 0) > before)
    wait_for("the worker to end the request", lambda: (
        lambda m: m.get("chunkserve_running", 1) == 0 and m.get("chunkserve_queued", 1) == 0 and
        m.get("chunkserve_kv_bytes_referenced", 1) == 0)(metrics(worker_url)))
    check(True, f"{label}: a client disconnect cancels the request and frees its chunks")


def choices_checks(url, label):
    """n > 1: n choices sampled on their own (choice i with seed + i), streamed by index."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(temperature=1.0, seed=7, max_tokens=8, extra_body={"ignore_eos": True})
    a = chat(client, "Name a part of a bicycle.", **{**kw, "n": 3})
    texts = [c.message.content for c in a.choices]
    check([c.index for c in a.choices] == [0, 1, 2] and all(texts) and
          all(c.finish_reason == "length" for c in a.choices),
          f"{label}: n=3 gives three choices, indexed 0..2: {texts}")
    check(len(set(texts)) > 1, f"{label}: the choices are sampled on their own")
    check(a.usage.completion_tokens == 24 and a.usage.total_tokens == a.usage.prompt_tokens + 24,
          f"{label}: usage counts the prompt once and every choice's tokens")
    one = chat(client, "Name a part of a bicycle.", **{**kw, "seed": 8})
    check(one.choices[0].message.content == texts[1] and
          one.usage.prompt_tokens == a.usage.prompt_tokens,
          f"{label}: choice 1 of seed 7 is the answer of seed 8")
    stream = chat(client, "Name a part of a bicycle.", stream=True,
                  stream_options={"include_usage": True}, **{**kw, "n": 3})
    streamed, finishes, usage = ["", "", ""], [None, None, None], None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                check(finishes[c.index] is None, f"{label}: choice {c.index} finishes once")
                finishes[c.index] = c.finish_reason
    check(streamed == texts and finishes == ["length"] * 3 and usage is not None and
          usage.completion_tokens == 24,
          f"{label}: streamed choices equal the non-streamed ones, each with its finish")
    c = client.completions.create(model=NAME, prompt="The best bicycle brake is", n=2,
                                  **{**kw, "max_tokens": 4})
    check(len(c.choices) == 2 and c.usage.completion_tokens == 8,
          f"{label}: completions take n too")


def main():
    procs = []
    try:
        worker = Proc([f"{BIN}/chunkserve-worker", "--listen", "127.0.0.1:0",
                       "--http", "127.0.0.1:0", "--model", MODEL, "--served-model-name", NAME,
                       "--kv-cache-mb", "256"])
        procs.append(worker)
        direct, direct_logprobs = api_checks(worker.url, "worker")
        disconnect_check(worker.url, worker.url, "worker")
        choices_checks(worker.url, "worker")
        disconnect_check(worker.url, worker.url, "worker, n=3", n=3)

        # A short client idle timeout: an answer that streams longer must still complete (the
        # gateway's link only reads while it is streamed to).
        router = Proc([f"{BIN}/chunkserve-router", "--listen", "127.0.0.1:0",
                       "--http", "127.0.0.1:0", "--tokenizer", MODEL,
                       "--served-model-name", NAME, "--idle-timeout-ms", "2000"])
        procs.append(router)
        worker2 = Proc([f"{BIN}/chunkserve-worker", "--listen", "127.0.0.1:0",
                        "--http", "127.0.0.1:0", "--model", MODEL, "--served-model-name", NAME,
                        "--kv-cache-mb", "256", "--router", f"127.0.0.1:{router.ports['listening']}"])
        procs.append(worker2)
        wait_for("the worker to register", lambda: metrics(router.url).get(
            "chunkserve_router_workers_alive", 0) >= 1)
        routed, routed_logprobs = api_checks(router.url, "router")
        check(routed == direct, "the router's greedy answer equals the worker's")
        check(len(routed_logprobs) == len(direct_logprobs) and
              all(t == u and abs(x - y) < 1e-3
                  for (t, x), (u, y) in zip(routed_logprobs, direct_logprobs)),
              "logprobs through the router equal the worker's")
        disconnect_check(router.url, worker2.url, "router")
        choices_checks(router.url, "router")
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        start = time.time()
        long = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=800,
                                         temperature=0, extra_body={"ignore_eos": True})
        took = time.time() - start
        check(long.usage.completion_tokens == 800,
              f"router: an answer streamed for {took:.1f} s outlives the 2 s client idle timeout")

        # The API key.
        keyfile = tempfile.NamedTemporaryFile("w", delete=False)
        keyfile.write("sk-test-0123456789abcdef\n")
        keyfile.close()
        # The API key on HTTP; TLS and a cluster secret on the wire port the gateway talks to.
        tls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing", "tls")
        env = dict(os.environ, CHUNKSERVE_CLUSTER_SECRET="cluster-secret-0123456789",
                   CHUNKSERVE_CLIENT_TOKEN="client-token-0123456789")
        secured = Proc([f"{BIN}/chunkserve-worker", "--listen", "127.0.0.1:0",
                        "--http", "127.0.0.1:0", "--model", MODEL, "--served-model-name", NAME,
                        "--kv-cache-mb", "64", "--api-key-file", keyfile.name,
                        "--tls-ca", f"{tls}/ca.pem", "--tls-cert", f"{tls}/node.pem",
                        "--tls-key", f"{tls}/node.key"], env=env)
        procs.append(secured)
        code, out = curl(secured.url + "/v1/models")
        check(code == 401 and "error" in json.loads(out), "no API key gets 401")
        code, out = curl("-H", "Authorization: Bearer wrong-key-0123456789", secured.url + "/v1/models")
        check(code == 401, "a wrong API key gets 401")
        client = openai.OpenAI(base_url=secured.url + "/v1", api_key="sk-test-0123456789abcdef",
                               max_retries=0)
        check(client.models.list().data[0].id == NAME, "the right API key is accepted")
        c = client.completions.create(model=NAME, prompt="Hello, my name is", max_tokens=8,
                                      temperature=0)
        check(c.usage.completion_tokens == 8,
              "the gateway reaches a wire port with TLS and a cluster secret")
        code, _ = curl(secured.url + "/livez")
        check(code == 200, "probes need no API key")
        os.unlink(keyfile.name)
    finally:
        for p in reversed(procs):
            p.stop()
    print(f"PASS: {checks} checks")


if __name__ == "__main__":
    main()
