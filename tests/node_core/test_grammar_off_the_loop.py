"""A constraint compiles off a node's loop (node_core/grammar_waits.py), on each kind of node in-process: while one
request's grammar compiles (held open by the test, so the compile is as slow as the test wants), another request
runs to its end and the node answers pings; the constrained request then runs to the same bits it gets with its
grammar cached (inverse: another seed gives other bits). A constraint that fails to compile after its wait is a
400 with the grammar library's reason; one aborted while it compiles gets no reply and leaves nothing behind.

If the compile ran inside the loop, the first step after its arrival would block for as long as the gate is shut
(GATE_TIMEOUT_S), the other request would not finish first, and the gate's timeout refuses the constrained request.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

import pytest

from colocated_node.server import ColocatedServer
from corun import structured
from launch.local import free_port
from tests.decode_node.test_decode_server import Bench, finished
from tests.node_sockets import router_socket, small_engine
from wire import protocol
from wire.config import NodeConfig
from wire.sampling_params import SamplingParams
from wire.structured import StructuredOutput

GATE_TIMEOUT_S = 60.0
VOCAB_SIZE = 2048
DEADLINE_S = 120.0
REGEX = StructuredOutput("regex", "(yes|no|maybe)[a-z]{2,6}")
FREE = SamplingParams(temperature=0.6, seed=5, max_tokens=6, logprobs=2, ignore_eos=True)


def constrained(seed: int = 11, spec: StructuredOutput = REGEX) -> SamplingParams:
    return SamplingParams(temperature=0.9, seed=seed, max_tokens=12, logprobs=2, structured=spec)


class GatedCompiles:
    """Holds every compile of the constraints in `held` until released; nothing is cached, so every node's request
    compiles (the test's nodes share one process's grammars)."""

    def __init__(self, monkeypatch):
        self.held: set[StructuredOutput] = set()
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.num_held_compiles = 0
        self.refusal: str | None = None
        """Released with a refusal: the held compile then fails with it, as a bad spec's late refusal."""
        real = structured.compile_spec

        def compile_spec(compiler, spec):
            if spec in self.held:
                self.num_held_compiles += 1
                self.waiting.set()
                if not self.release.wait(GATE_TIMEOUT_S):
                    raise RuntimeError("the test's gate timed out")
                if self.refusal is not None:
                    raise ValueError(self.refusal)
            return real(compiler, spec)

        monkeypatch.setattr(structured, "compile_spec", compile_spec)
        monkeypatch.setattr(structured, "MAX_CACHED_GRAMMARS", 0)

    def hold(self, spec: StructuredOutput) -> None:
        self.held.add(spec)
        self.release.clear()
        self.waiting.clear()

    def open(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.held.clear()
        self.release.set()


@pytest.fixture
def gate(monkeypatch):
    gate = GatedCompiles(monkeypatch)
    yield gate
    gate.open()


def tokens_of(events) -> tuple[list[int], list]:
    token_ids, logprobs = [], []
    for event in events:
        if isinstance(event, protocol.TokenEvent):
            token_ids += event.token_ids
            logprobs += event.logprobs or []
    return token_ids, logprobs


def until(step, done, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        step()
        assert time.monotonic() < deadline, f"{what}\n{compile_threads()}"


def compile_threads() -> str:
    """Where each compile thread of this process is now (a failure's context: what holds the compiles)."""
    frames = sys._current_frames()
    return "\n".join(f"{thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
                     for thread in threading.enumerate() if thread.name.startswith("grammar-compile"))


def next_prefill_reply(bench: Bench):
    """The prefill node's next message to the router, stepping it until one comes."""
    until(bench.prefill.step, lambda: bench.to_prefill.poll(1), "no reply from the prefill node")
    return protocol.decode(bench.to_prefill.recv_multipart()[-1])


# --- the decode node (and its prefill node beside it) --------------------------------------------------------------
@pytest.fixture
def bench(tiny_model_dir):
    bench = Bench(tiny_model_dir)
    yield bench
    bench.close()


def decoded(bench: Bench, request_id: str, params: SamplingParams, first_id: int = 30) -> list:
    result, prompt = bench.prefilled(request_id, params=params, first_id=first_id)
    bench.send_decode(result, prompt, params=params)
    return bench.until(finished, max_turns=2000)


def test_a_decode_node_streams_and_answers_pings_while_a_grammar_compiles(bench, gate):
    cached = tokens_of(decoded(bench, "reference", constrained()))  # NOTE: compiled without waiting (gate open)
    other_seed = tokens_of(decoded(bench, "other-seed", constrained(seed=12)))
    assert other_seed[0] != cached[0], "inverse: the comparison below tells bits apart"

    slow, slow_prompt = bench.prefilled("slow", params=constrained())
    gate.hold(REGEX)  # NOTE: the prefill node compiled it; now the decode node's compile waits
    free, free_prompt = bench.prefilled("free", params=FREE, first_id=40)
    bench.send_decode(slow, slow_prompt, params=constrained())
    bench.send_decode(free, free_prompt, params=FREE)
    replies = []
    until(lambda: replies.extend(bench.step()), lambda: gate.waiting.is_set() and finished(replies),
          "the unconstrained request did not finish while the grammar compiled")
    assert not gate.release.is_set() and {r.request_id for r in replies} == {"free"}
    assert sum(len(e.token_ids) for e in replies) == FREE.max_tokens
    stats = bench.decode.stats()
    assert stats["num_compiling_grammars"] == 1 and stats["num_waiting"] == 1
    bench.to_decode.send(protocol.encode(protocol.Ping(7)))
    pongs = bench.until(lambda got: any(isinstance(r, protocol.Pong) for r in got))
    assert [p.nonce for p in pongs if isinstance(p, protocol.Pong)] == [7]

    gate.open()
    assert tokens_of(bench.until(finished, max_turns=2000)) == cached
    bench.step(3)
    bench.assert_idle()


def test_a_decode_request_aborted_while_its_grammar_compiles_gets_no_reply_and_its_id_is_free(bench, gate):
    result, prompt = bench.prefilled("gone", params=constrained())
    gate.hold(REGEX)
    bench.send_decode(result, prompt, params=constrained())
    until(bench.step, gate.waiting.is_set, "the decode node never started the compile")
    assert bench.decode.holds("gone")
    bench.to_decode.send(protocol.encode(protocol.Abort("gone")))
    until(bench.step, lambda: not bench.decode.holds("gone"), "the abort never reached the compiling request")
    gate.open()
    assert bench.step(5) == [] and bench.decode.stats()["num_compiling_grammars"] == 0
    bench.assert_idle()


def test_a_decode_node_reads_the_kv_while_the_grammar_compiles_so_a_compile_past_the_lease_still_runs(
        tiny_model_dir, gate):
    """The decode node claims and reads the prompt's KV while its grammar compiles (the prefill node's lease ends
    with the read, not with the compile): a compile held past the lease still runs, to the cached bits, once it ends.
    Compiling before the claim, as at stop 60, spent the lease on the compile: the claim came late (a 503)."""
    bench = Bench(tiny_model_dir, lease_s=1.0)
    try:
        cached = tokens_of(decoded(bench, "reference", constrained()))
        slow, slow_prompt = bench.prefilled("slow", params=constrained())
        gate.hold(REGEX)
        bench.send_decode(slow, slow_prompt, params=constrained())
        until(bench.step, lambda: "slow" in bench.decode.awaiting_grammar and gate.waiting.is_set(),
              "the KV was not read during the compile")
        assert not gate.release.is_set()
        bench.assert_prefill_idle()  # NOTE: its lease ended with the read
        time.sleep(1.5)  # NOTE: past the lease
        assert bench.step(3) == [] and bench.decode.stats()["num_waiting"] == 1
        gate.open()
        replies = bench.until(finished, max_turns=2000)
        assert not any(isinstance(r, protocol.ErrorReply) for r in replies)
        assert tokens_of(replies) == cached
        other_prompt = tokens_of(decoded(bench, "other-prompt", constrained(), first_id=60))
        assert other_prompt[0] != cached[0], "inverse: the comparison tells bits apart"
        bench.step(3)
        bench.assert_idle()
    finally:
        bench.close()


@pytest.mark.parametrize("read_first", [True, False])
def test_a_decode_request_whose_grammar_fails_late_is_a_400_and_frees_what_it_held(bench, gate, read_first):
    """Refused once read (its blocks held, awaiting the grammar) or while its claim is in flight (freed when the claim
    ends, the lease given back): a 400, nothing left behind, and the next request runs."""
    result, prompt = bench.prefilled("bad", params=constrained())
    gate.hold(REGEX)
    bench.send_decode(result, prompt, params=constrained())
    if read_first:
        until(bench.step, lambda: "bad" in bench.decode.awaiting_grammar and gate.waiting.is_set(),
              "the KV was not read during the compile")
    else:
        until(bench.decode.step, lambda: "bad" in bench.decode.claiming and gate.waiting.is_set(),
              "no claim")  # NOTE: no prefill turn: the claim stays in flight
    gate.open(refusal="no such thing")
    replies = bench.until(lambda got: any(isinstance(r, protocol.ErrorReply) for r in got))
    error = next(r for r in replies if isinstance(r, protocol.ErrorReply))
    assert (error.request_id, error.status, error.constraint_reason) == ("bad", 400, "no such thing")
    bench.step(5)
    assert not bench.decode.holds("bad")
    bench.assert_idle()
    bench.assert_prefill_idle()
    bench.send_decode(*bench.prefilled("next"))
    assert sum(len(e.token_ids) for e in bench.until(finished)) == FREE.max_tokens


def test_a_decode_request_aborted_while_read_and_awaiting_its_grammar_frees_its_blocks(bench, gate):
    result, prompt = bench.prefilled("gone", params=constrained())
    gate.hold(REGEX)
    bench.send_decode(result, prompt, params=constrained())
    until(bench.step, lambda: "gone" in bench.decode.awaiting_grammar, "the KV was not read during the compile")
    bench.to_decode.send(protocol.encode(protocol.Abort("gone")))
    until(bench.step, lambda: not bench.decode.holds("gone"), "the abort never reached the request")
    assert bench.decode.stats()["num_compiling_grammars"] == 0, "its compile is given up"
    gate.open()
    assert bench.step(5) == []
    bench.assert_idle()


def test_a_constraint_that_fails_after_its_wait_is_a_400_with_its_reason(bench, gate):
    gate.hold(REGEX)
    bench.to_prefill.send(protocol.encode(protocol.PrefillRequest("bad", list(range(30, 50)), constrained())))
    until(bench.prefill.step, gate.waiting.is_set, "the prefill node never started the compile")
    assert bench.prefill.holds("bad") and not bench.to_prefill.poll(0)
    gate.open(refusal="no such thing")
    reply = next_prefill_reply(bench)
    assert isinstance(reply, protocol.ErrorReply) and (reply.request_id, reply.status) == ("bad", 400)
    assert reply.constraint_reason == "no such thing" and "invalid regex constraint" in reply.message
    assert not bench.prefill.holds("bad")
    bench.assert_prefill_idle()


# --- the prefill node ---------------------------------------------------------------------------------------------
def test_a_prefill_node_prefills_and_answers_pings_while_a_grammar_compiles(bench, gate):
    reference = bench.prefilled("reference", params=constrained())[0].first_tokens
    gate.hold(REGEX)
    bench.to_prefill.send(protocol.encode(protocol.PrefillRequest("slow", list(range(30, 50)), constrained())))
    until(bench.prefill.step, gate.waiting.is_set, "the prefill node never started the compile")
    free, _ = bench.prefilled("free", params=FREE, first_id=40)
    assert free.request_id == "free" and not gate.release.is_set()
    assert bench.prefill.stats()["num_compiling_grammars"] == 1
    bench.to_prefill.send(protocol.encode(protocol.Ping(8)))
    assert next_prefill_reply(bench).nonce == 8
    gate.open()
    slow = next_prefill_reply(bench)
    assert slow.request_id == "slow" and slow.first_tokens == reference
    other_prompt = bench.prefilled("other-prompt", params=constrained(), first_id=60)[0].first_tokens
    assert other_prompt != reference, "inverse: the comparison tells bits apart"


def test_requests_with_the_same_constraint_share_one_compile(bench, gate):
    """A burst of requests with one new schema (an evaluation's) compiles it once, not once per request queued behind
    the others; inverse: once that compile ended (nothing is cached here), the next request compiles again."""
    gate.hold(REGEX)
    for i in range(3):
        bench.to_prefill.send(protocol.encode(protocol.PrefillRequest(f"same-{i}", list(range(30, 50)),
                                                                      constrained(seed=i))))
    until(bench.prefill.step, lambda: bench.prefill.stats()["num_compiling_grammars"] == 3, "3 waiting compiles")
    gate.release.set()
    results = [next_prefill_reply(bench) for _ in range(3)]
    assert sorted(r.request_id for r in results) == ["same-0", "same-1", "same-2"]
    assert gate.num_held_compiles == 1
    bench.prefilled("later", params=constrained())
    assert gate.num_held_compiles == 2, "inverse: the counter counts every compile"


def test_a_compile_nobody_waits_for_any_more_is_cancelled_before_it_starts(tiny_model_dir, gate, monkeypatch):
    """Aborted requests (or a closed node) leave their queued compiles: the last waiter's give_up cancels one not yet
    started, so it takes no turn of the compile threads; inverse: one that has started goes on to the end."""
    monkeypatch.setattr(structured, "COMPILE_THREADS", 1)
    grammars = structured.Grammars(tiny_model_dir)  # NOTE: its own compile thread, held by the first compile
    queued = StructuredOutput("regex", "[d-f]{2,5}")
    gate.hold(REGEX)
    gate.held.add(queued)
    running = grammars.compile_later(REGEX, VOCAB_SIZE)
    assert gate.waiting.wait(GATE_TIMEOUT_S)
    first, second = grammars.compile_later(queued, VOCAB_SIZE), grammars.compile_later(queued, VOCAB_SIZE)
    assert first is second
    grammars.give_up(queued, VOCAB_SIZE, first)
    assert not first.cancelled(), "another waiter still waits for it"
    grammars.give_up(queued, VOCAB_SIZE, second)
    assert first.cancelled()
    grammars.give_up(REGEX, VOCAB_SIZE, running)
    gate.open()
    assert running.result(GATE_TIMEOUT_S) is not None and gate.num_held_compiles == 1
    again = grammars.compile_later(queued, VOCAB_SIZE)
    assert again is not first and again.result(GATE_TIMEOUT_S) is not None


def test_another_clients_constraint_compiles_while_one_clients_compile_holds_every_thread(tiny_model_dir, gate,
                                                                                           monkeypatch):
    """A compile cannot be interrupted: one client's held compile (a huge schema's minutes) holds the only compile
    thread, and past SPARE_COMPILE_AFTER_S another client's constraint compiles on a spare; the first client's next
    constraint still waits (it has a compile running). Inverse: with no spare, the other client's waits too."""
    monkeypatch.setattr(structured, "COMPILE_THREADS", 1)
    monkeypatch.setattr(structured, "SPARE_COMPILE_AFTER_S", 0.2)
    for max_spares in (1, 0):
        monkeypatch.setattr(structured, "MAX_SPARE_COMPILES", max_spares)
        grammars = structured.Grammars(tiny_model_dir)
        own, other = StructuredOutput("regex", "[d-f]{2,5}"), StructuredOutput("regex", "[g-i]{2,5}")
        gate.hold(REGEX)
        gate.held.add(own)
        held = grammars.compile_later(REGEX, VOCAB_SIZE, "hostile")
        assert gate.waiting.wait(GATE_TIMEOUT_S)
        same_client = grammars.compile_later(own, VOCAB_SIZE, "hostile")
        other_client = grammars.compile_later(other, VOCAB_SIZE, "other")
        if max_spares:
            assert other_client.result(GATE_TIMEOUT_S) is not None
        else:
            time.sleep(1.0)
            assert not other_client.done()
        assert not same_client.done() and not held.done()
        gate.open()
        assert held.result(GATE_TIMEOUT_S) is not None and same_client.result(GATE_TIMEOUT_S) is not None
        assert other_client.result(GATE_TIMEOUT_S) is not None


# --- the colocated node -------------------------------------------------------------------------------------------
@pytest.fixture
def colocated(tiny_model_dir):
    node = ColocatedServer(NodeConfig("colocated", "colocated-g", small_engine(tiny_model_dir),
                                      port=free_port("127.0.0.1")))
    with router_socket(node.config.address) as router:
        yield node, router
    node.close()


def collect(node, router, events: dict, pongs: list) -> None:
    """One step of the node, then what it sent: events by request id, Pongs' nonces."""
    node.step()
    while router.poll(0):
        message = protocol.decode(router.recv_multipart()[-1])
        if isinstance(message, protocol.Pong):
            pongs.append(message.nonce)
            continue
        for event in getattr(message, "events", [message]):
            events.setdefault(event.request_id, []).append(event)


def ended(events: dict, request_id: str) -> bool:
    return any(getattr(e, "finish_reason", None) or isinstance(e, protocol.ErrorReply)
               for e in events.get(request_id, []))


def test_a_colocated_node_decodes_and_answers_pings_while_a_grammar_compiles(colocated, gate):
    node, router = colocated
    prompt = list(range(30, 50))
    events, pongs = {}, []

    def step():
        collect(node, router, events, pongs)

    for request_id, seed in (("reference", 11), ("other-seed", 12)):
        router.send(protocol.encode(protocol.GenerateRequest(request_id, prompt, constrained(seed))))
        until(step, lambda rid=request_id: ended(events, rid), f"{request_id} did not end")
    reference, other_seed = tokens_of(events.pop("reference")), tokens_of(events.pop("other-seed"))
    assert other_seed[0] != reference[0], "inverse: the comparison below tells bits apart"

    gate.hold(REGEX)
    router.send(protocol.encode(protocol.GenerateRequest("slow", prompt, constrained())))
    router.send(protocol.encode(protocol.GenerateRequest("free", list(range(40, 60)), FREE)))
    until(step, lambda: gate.waiting.is_set() and ended(events, "free"),
          "the unconstrained request did not finish while the grammar compiled")
    assert not gate.release.is_set() and "slow" not in events
    assert sum(len(e.token_ids) for e in events["free"]) == FREE.max_tokens
    assert node.stats()["num_compiling_grammars"] == 1
    router.send(protocol.encode(protocol.Ping(9)))
    until(step, lambda: pongs == [9], "no Pong")
    gate.open()
    until(step, lambda: ended(events, "slow"), "the constrained request did not end")
    assert tokens_of(events["slow"]) == reference
