"""vLLM's output fields: stop_reason filled, include_stop_str_in_output, skip_special_tokens and
return_tokens_as_token_ids; none changes the tokens. vLLM's tokenizer endpoints (/tokenize, /detokenize, /version,
/tokenizer_info)."""

import json
import shutil
from pathlib import Path

import pytest

from router.generation.detokenizer import IncrementalDetokenizer
from tests.router.test_errors import VALID, completions

pytestmark = pytest.mark.timeout(30)
LONG = {**VALID, "max_tokens": 12, "return_token_ids": True}


def first_choice(router, **fields) -> dict:
    reply = completions(router, {**LONG, **fields})
    assert reply.status == 200, reply.body
    return reply.body["choices"][0]


def test_a_stop_string_is_the_stop_reason_and_can_stay_in_the_text(router):
    plain = first_choice(router)
    assert plain["stop_reason"] is None and plain["finish_reason"] == "length"
    stop = plain["text"][len(plain["text"]) // 2:][:3].strip() or plain["text"][-2:]
    stopped = first_choice(router, stop=[stop])
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    assert stop not in stopped["text"] and plain["text"].startswith(stopped["text"])
    kept = first_choice(router, stop=[stop], include_stop_str_in_output=True)
    assert kept["text"] == stopped["text"] + stop and kept["token_ids"] == stopped["token_ids"]


def test_a_stop_token_id_is_the_stop_reason(router):
    plain = first_choice(router)
    stop_id = plain["token_ids"][4]
    stopped = first_choice(router, stop_token_ids=[stop_id])
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop_id
    assert stopped["token_ids"] == plain["token_ids"][:plain["token_ids"].index(stop_id) + 1]


def test_tokens_as_token_ids_name_every_logprob_entry_by_id(router):
    named = first_choice(router, logprobs=2, return_tokens_as_token_ids=True)
    assert named["logprobs"]["tokens"] == [f"token_id:{t}" for t in named["token_ids"]]
    assert all(key.startswith("token_id:") for top in named["logprobs"]["top_logprobs"] for key in top)
    plain = first_choice(router, logprobs=2)
    assert plain["token_ids"] == named["token_ids"] and not plain["logprobs"]["tokens"][0].startswith("token_id:")


def test_special_tokens_show_only_when_asked(tokenizer):
    ids = tokenizer.encode("the cat") + [tokenizer.eos_token_id]
    hidden = IncrementalDetokenizer(tokenizer).add(ids, finished=True).text
    shown = IncrementalDetokenizer(tokenizer, skip_special_tokens=False).add(ids, finished=True).text
    special = tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False)
    assert special and shown == hidden + special and special not in hidden


def test_tokenize_detokenize_and_version_answer_as_vllm(router, tokenizer):
    from tests.router.harness import get, post

    tokens = post(router.base_url + "/tokenize", {"model": "corun-tiny", "prompt": "the cat sat"})
    assert tokens.status == 200 and tokens.body["tokens"] == tokenizer.encode("the cat sat")
    assert tokens.body["count"] == len(tokens.body["tokens"]) and tokens.body["max_model_len"] == 1024
    chat = post(router.base_url + "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status == 200 and chat.body["count"] > 1
    text = post(router.base_url + "/detokenize", {"tokens": tokens.body["tokens"]})
    assert text.status == 200 and text.body["prompt"] == "the cat sat"
    assert post(router.base_url + "/detokenize", {"tokens": [10**9]}).status == 400
    assert post(router.base_url + "/tokenize", {"model": "gpt-4", "prompt": "x"}).status == 404
    assert post(router.base_url + "/tokenize", {}).status == 400
    version = get(router.base_url + "/version")
    assert version.status == 200 and version.body["version"]


def test_tokenizer_info_is_served_only_when_enabled_as_vllm_s(router, tiny_model_dir, word_token_ids, tokenizer):
    from tests.router.harness import RouterHarness, get

    assert get(router.base_url + "/tokenizer_info").status == 404  # NOTE: off by default, as vLLM's
    config = json.loads((Path(tiny_model_dir) / "tokenizer_config.json").read_text())
    with RouterHarness(tiny_model_dir, word_token_ids, enable_tokenizer_info_endpoint=True) as enabled:
        info = get(enabled.base_url + "/tokenizer_info")
    assert info.status == 200 and info.body["tokenizer_class"] == config["tokenizer_class"]
    assert info.body["eos_token"] == config["eos_token"] and info.body["chat_template"] == config["chat_template"]
    assert info.body["model_max_length"] == config["model_max_length"]
    eos = info.body["added_tokens_decoder"][str(tokenizer.eos_token_id)]
    assert eos["content"] == config["eos_token"] and eos["special"] is True



def test_tokenizer_info_leaves_out_the_server_s_file_paths(tiny_model_dir, tokenizer, tmp_path):
    from router.api.tokens import tokenizer_info_body

    shutil.copy(Path(tiny_model_dir) / "tokenizer.json", tmp_path)
    config = json.loads((Path(tiny_model_dir) / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "vocab_file": "/srv/vocab.json",
                                                                "merges_file": "/srv/merges.txt"}))
    info = json.loads(tokenizer_info_body(tmp_path, tokenizer))
    assert "vocab_file" not in info and "merges_file" not in info and info["pad_token"] == config["pad_token"]
