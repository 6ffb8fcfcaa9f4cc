"""Issue 23, finding 1: what one request can make the router do before it is refused is bounded by the context
length, not by the body size; a parse in a worker process has a deadline and stops when its client goes."""

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from router.api.errors import RequestError
from router.api.offload import INLINE_BODY_BYTES, LARGE_BODY_BYTES, Offload
from router.api.openai_api import ModelInfo, parse_body
from router.api.tokens import tokenize_body
from tests.router.harness import post, wait_for
from tests.router.test_errors import VALID, assert_error
from tests.router.test_security import is_running, raw_connection, unique_text

pytestmark = pytest.mark.timeout(60)
MAX_MODEL_LEN = 1024
MODEL = ModelInfo("corun-tiny", MAX_MODEL_LEN, vocab_size=2048, max_logprobs=20, max_num_prompts=8)


class CountingTokenizer:
    """The tiny model's tokenizer, counting the characters it is asked to encode."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.num_encoded_chars = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.num_encoded_chars += len(text)
        return self._tokenizer.encode(text, add_special_tokens)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def body(**fields) -> bytes:
    return json.dumps({**VALID, **fields}).encode()


def refusal(tokenizer, raw: bytes, kind: str = "completion") -> RequestError:
    with pytest.raises(RequestError) as refused:
        parse_body(tokenizer, raw, kind, MODEL)
    return refused.value


@pytest.mark.parametrize("kind, fields, param", [
    ("completion", {"prompt": "a" * 300_000}, "prompt"),
    ("completion", {"prompt": ["the cat", "a" * 300_000]}, "prompt"),
    ("chat", {"messages": [{"role": "user", "content": "a" * 300_000}]}, "messages"),
])
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_it_is_encoded(tokenizer, kind, fields, param):
    """One long "word" cost the parser ~200 B per character to encode (a 32 MiB body: ~6.5 GB) before the length
    check refused it: now no text longer than max_model_len tokens can be is encoded."""
    counting = CountingTokenizer(tokenizer)
    refused = refusal(counting, body(**fields), kind)
    assert refused.status == 400 and refused.param == param
    assert "maximum context length" in refused.message and "characters" in refused.message
    # NOTE: once "the messages has ...": the field is named, and the verb agrees with "the text"
    assert f"However, the text of '{param}' has " in refused.message
    assert counting.num_encoded_chars <= tokenizer.max_text_chars(MAX_MODEL_LEN)


def test_the_tokenize_endpoint_encodes_no_text_longer_than_the_context_can_hold(tokenizer):
    counting = CountingTokenizer(tokenizer)
    with pytest.raises(RequestError) as refused:
        tokenize_body(counting, json.dumps({"prompt": "a" * 300_000}).encode(), "corun-tiny", MAX_MODEL_LEN)
    assert refused.value.status == 400 and counting.num_encoded_chars == 0


def test_a_request_with_more_prompts_than_the_router_admits_is_refused_before_any_is_encoded(tokenizer):
    counting = CountingTokenizer(tokenizer)
    refused = refusal(counting, body(prompt=["the cat"] * (MODEL.max_num_prompts + 1)))
    assert refused.status == 400 and f"at most {MODEL.max_num_prompts} prompts" in refused.message
    assert counting.num_encoded_chars == 0
    assert parse_body(counting, body(prompt=["the cat"] * MODEL.max_num_prompts), "completion", MODEL).prompts


def test_the_first_prompt_too_long_in_tokens_ends_the_encoding(tokenizer):
    """A list of prompts, each within the character bound but over the context in tokens: encoding stops at the
    first one."""
    long_prompt = " ".join(f"w{i}" for i in range(2 * MAX_MODEL_LEN))
    assert len(long_prompt) <= tokenizer.max_text_chars(MAX_MODEL_LEN)
    counting = CountingTokenizer(tokenizer)
    refused = refusal(counting, body(prompt=[long_prompt] * 4))
    assert refused.status == 400 and "maximum context length" in refused.message
    assert counting.num_encoded_chars == len(long_prompt)


def test_a_body_at_the_size_limit_is_refused_by_the_router(router):
    """The whole path, in a parser process: a one-word prompt of 32 MiB (the default body limit) is a 400."""
    raw = body(prompt="")
    raw = raw.replace(b'"prompt": ""', b'"prompt": "' + b"a" * (router.state.config.max_request_bytes - len(raw))
                      + b'"')
    assert len(raw) == router.state.config.max_request_bytes
    assert_error(post(router.base_url + "/v1/completions", raw=raw), 400, "maximum context length", "characters")
    assert post(router.base_url + "/v1/completions", VALID).status == 200


def record_pid_and_sleep(tokenizer, body: bytes, pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(3600)  # NOTE: a parse that never ends (an encode cannot be interrupted)


def worker_pid(tokenizer, body: bytes) -> int:
    return os.getpid()


def wait_for_pid(pid_file: Path) -> int:
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.02)
    return int(pid_file.read_text())


def wait_until_gone(pid: int) -> None:
    while is_running(pid):  # NOTE: pytest-timeout bounds the wait
        time.sleep(0.02)


LARGE = b" " * LARGE_BODY_BYTES


def sleep_forever(tokenizer, body: bytes) -> None:
    time.sleep(3600)


def where_parsed(tokenizer, body: bytes) -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def test_each_body_size_is_parsed_where_its_tier_says(tiny_model_dir, tokenizer):
    """On the loop below INLINE_BODY_BYTES (500 token ids, lm-eval's multiple choice, included), in a thread below
    LARGE_BODY_BYTES, in a parser process from there on."""
    five_hundred_ids = json.dumps({"prompt": list(range(1000, 1500)), "max_tokens": 1}).encode()
    assert len(five_hundred_ids) < INLINE_BODY_BYTES

    async def scenario():
        offload = Offload(tiny_model_dir, tokenizer, parse_timeout_s=30.0)
        here = os.getpid(), threading.get_ident()
        try:
            assert await offload.run(where_parsed, five_hundred_ids) == here
            assert await offload.run(where_parsed, b" " * (INLINE_BODY_BYTES - 1)) == here
            in_thread = await offload.run(where_parsed, b" " * INLINE_BODY_BYTES)
            assert in_thread[0] == here[0] and in_thread[1] != here[1]
            assert (await offload.run(where_parsed, b" " * (LARGE_BODY_BYTES - 1)))[0] == here[0]
            assert (await offload.run(where_parsed, LARGE))[0] != here[0]
        finally:
            offload.close()

    asyncio.run(scenario())


def test_a_parse_past_its_deadline_is_a_413_and_its_worker_is_stopped(tiny_model_dir, tokenizer):
    async def scenario():
        # NOTE: a deadline the trivial calls meet on a loaded 2-core host (0.5 s did not, once, in the whole suite)
        offload = Offload(tiny_model_dir, tokenizer, parse_timeout_s=3.0)
        try:
            pid = await offload.run(worker_pid, LARGE)  # NOTE: the worker the next parse takes (it is idle now)
            with pytest.raises(RequestError) as late:
                await offload.run(sleep_forever, LARGE)
            assert late.value.status == 413 and "--parse-timeout-s" in late.value.message
            await asyncio.to_thread(wait_until_gone, pid)  # NOTE: while the router still runs: not at close()
            assert await offload.run(worker_pid, LARGE) != pid  # NOTE: the next body gets a fresh worker
        finally:
            offload.close()

    asyncio.run(scenario())


def test_a_parse_whose_client_goes_stops_its_worker(tiny_model_dir, tokenizer, tmp_path):
    """aiohttp cancels the handler of a client that hangs up (handler_cancellation): that cancels the parse."""
    pid_file = tmp_path / "pid"

    async def scenario():
        offload = Offload(tiny_model_dir, tokenizer, parse_timeout_s=3600.0)
        try:
            parse = asyncio.create_task(offload.run(record_pid_and_sleep, LARGE, str(pid_file)))
            pid = await asyncio.to_thread(wait_for_pid, pid_file)
            parse.cancel()
            with pytest.raises(asyncio.CancelledError):
                await parse
            await asyncio.to_thread(wait_until_gone, pid)  # NOTE: while the router still runs: not at close()
            assert await offload.run(worker_pid, LARGE) != pid
        finally:
            offload.close()

    asyncio.run(scenario())


def parsing_pids(offload: Offload) -> list[int]:
    """The parser processes busy now."""
    return [worker.process.pid for worker in offload._workers if worker not in offload._idle]


def test_a_client_that_hangs_up_mid_parse_stops_its_parser_process(long_context):
    """Through HTTP: aiohttp cancels the handler of a client that goes, and that stops the parse's process. The
    nodes report a 2**19-token context, so a 3 MB prompt is encoded (for seconds) before it is refused."""
    raw = body(prompt=unique_text(3 * 2**20))
    with raw_connection(long_context) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        wait_for(lambda: parsing_pids(long_context.state.offload))
        pids = parsing_pids(long_context.state.offload)
    wait_for(lambda: not any(is_running(pid) for pid in pids))
    assert post(long_context.base_url + "/v1/completions", VALID).status == 200
