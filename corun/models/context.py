"""The longest sequence a model is made for, and max_model_len checked against it.

Imports no torch: `corun serve` runs the check before it starts any process (launch/cluster.py check_model), and
every engine runs it again where it is built (corun/device_facts.py), for the programs that start one directly.
"""

from __future__ import annotations

from corun.models.config import context_length
from corun.models.presets import is_random_spec, preset_config
from wire.config import EngineConfig


def model_context(model: str) -> tuple[int, str] | None:
    """The longest sequence the model (a checkpoint directory or a random preset) is made for, and where it was read;
    None where nothing says."""
    if is_random_spec(model):
        return preset_config(model).max_position_embeddings, "the preset's max_position_embeddings"
    return context_length(model)


def check_context_length(config: EngineConfig) -> None:
    """A ValueError when max_model_len is longer than the model is made for, as vLLM refuses it: RoPE at positions
    the model never saw gives text of no use (and the tokenizer's own limit says the same)."""
    found = model_context(config.model)
    if found is None or config.scheduler.max_model_len <= found[0]:
        return
    most, where = found
    raise ValueError(f"--max-model-len {config.scheduler.max_model_len} is longer than the model's context, {most} "
                     f"({where} of {config.model}): give at most {most}")
