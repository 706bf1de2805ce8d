"""A checkpoint's recommended sampling settings, from its generation_config.json.

Instruct models ship them (Qwen2.5: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05;
Llama 3.1: temperature 0.6, top_p 0.9), and transformers' ``generate`` uses them. brisklm applies
them where the caller gives no ``SamplingParams`` (as vLLM does with ``generation_config="auto"``):
``LLM.default_sampling_params()``, the CLI's unset flags, and ChatBrisk / BriskLLM's unset fields.
A checkpoint whose file says ``"do_sample": false`` is decoded greedily (temperature 0; its
repetition_penalty and max_new_tokens still apply), as transformers' ``generate`` does with it: the
bundled models say so. vLLM ignores ``do_sample`` and samples such a checkpoint at temperature 1.0
(or the file's temperature); brisklm takes the file's own word. Without the key, a checkpoint that
names a temperature is sampled with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"
# generation_config.json key -> SamplingParams field.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def sampling_defaults(model_dir: str | Path) -> dict[str, Any]:
    """SamplingParams fields the checkpoint recommends (empty without generation_config.json).

    A value SamplingParams would refuse is skipped with a warning, not an error: the file is
    advice, and the model still runs with brisklm's own default for that field.
    """
    from brisklm.sampling.params import SamplingParams

    path = Path(model_dir) / GENERATION_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.warning("%s is unreadable (%s): no sampling defaults taken from it", path, error)
        return {}
    if not isinstance(config, dict):
        return {}
    defaults: dict[str, Any] = {}
    for key, field_name in SAMPLING_KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        try:
            SamplingParams(**{field_name: value})
        except (TypeError, ValueError) as error:
            logger.warning("%s: %s=%r is not used (%s)", path, key, value, error)
            continue
        defaults[field_name] = value
    if config.get("do_sample") is False:
        # Greedy: transformers reads no temperature or filter then (and warns if the file has them).
        for field_name in ("temperature", "top_k", "top_p", "min_p"):
            defaults.pop(field_name, None)
        defaults["temperature"] = 0.0
    return defaults
