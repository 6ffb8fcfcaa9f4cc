"""The compatibility dict, its hash, and the mismatch message."""

from __future__ import annotations

import pytest
import torch

from transfer.compat import KV_LAYOUT, IncompatiblePeer, check_compatible, compat_hash, compat_info
from wire.protocol import PROTOCOL_VERSION

FIELDS = {"model_digest": "ab12", "dtype": "float32", "num_layers": 4, "num_kv_heads": 4, "head_dim": 32,
          "block_size": 16, "max_num_seqs": 32, "prefill_chunk_size": 512, "max_model_len": 1024}
CHANGED = {"model_digest": "cd34", "dtype": "bfloat16", "num_layers": 5, "num_kv_heads": 2, "head_dim": 64,
           "block_size": 32, "max_num_seqs": 16, "prefill_chunk_size": 256, "max_model_len": 2048,
           "kv_layout": "layer-major", "protocol_version": PROTOCOL_VERSION + 1}


def test_info_holds_every_field_with_layout_and_protocol_version():
    info = compat_info(**FIELDS)
    assert info == {**FIELDS, "kv_layout": KV_LAYOUT, "protocol_version": PROTOCOL_VERSION}
    assert set(info) == set(CHANGED)


def test_torch_dtype_is_stored_as_its_name():
    assert compat_info(**{**FIELDS, "dtype": torch.float32}) == compat_info(**FIELDS)


@pytest.mark.parametrize("drop, add", [("block_size", {}), (None, {"tensor_parallel": 2})])
def test_missing_or_unknown_fields_are_refused(drop, add):
    fields = {name: value for name, value in FIELDS.items() if name != drop}
    with pytest.raises(ValueError, match="missing fields|unknown fields"):
        compat_info(**fields, **add)


def test_hash_is_stable_and_order_independent():
    info = compat_info(**FIELDS)
    assert compat_hash(info) == compat_hash(dict(reversed(list(info.items()))))
    assert compat_hash(info) == compat_hash(compat_info(**FIELDS))
    assert len(compat_hash(info)) == 16 and int(compat_hash(info), 16) >= 0


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_hash_changes_with_every_field(name):
    base = compat_info(**FIELDS)
    assert compat_hash({**base, name: CHANGED[name]}) != compat_hash(base)


def test_compatible_peer_passes():
    check_compatible(compat_info(**FIELDS), compat_info(**FIELDS), "prefill-0")


def test_mismatch_message_names_every_differing_field_with_both_values():
    local = compat_info(**FIELDS)
    remote = compat_info(**{**FIELDS, "block_size": 32, "dtype": "bfloat16"})
    with pytest.raises(IncompatiblePeer) as error:
        check_compatible(local, remote, "prefill-0")
    assert str(error.value) == "peer prefill-0 is incompatible: block_size 16 != 32; dtype float32 != bfloat16"


def test_field_missing_on_one_side_is_a_mismatch():
    local = compat_info(**FIELDS)
    remote = {name: value for name, value in local.items() if name != "max_num_seqs"}
    with pytest.raises(IncompatiblePeer, match="max_num_seqs 32 != <missing>"):
        check_compatible(local, remote, "prefill-1")
