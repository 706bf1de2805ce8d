"""A tiny random chat checkpoint in the bundled model's format: ChatML with tools, tool-call tags as added tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.tiny import make_tiny_checkpoint

TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]

# ChatML with a tools section and Hermes-style tool calls, written like the bundled model's template:
# the assistant's calls are `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, joined by "\n".
TOOLS_CHATML_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- 'Tools:\\n' -}}"
    "{%- for tool in tools -%}{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.index0 == 0 and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in (message['tool_calls'] or []) -%}"
    "{%- set call = call['function'] if call['function'] is defined else call -%}"
    "{%- if loop.index0 > 0 or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (call['name'] | tojson) + ', \"arguments\": ' -}}"
    "{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def make_tiny_chat_checkpoint(directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """The tiny checkpoint of tests.tiny, with `<tool_call>`/`</tool_call>` added and a tools template."""
    from tokenizers import AddedToken, Tokenizer

    settings = {"max_position_embeddings": 2048, **overrides}
    make_tiny_checkpoint(directory, seed=seed, **settings)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    # Added but not special, as in the bundled model: decoding keeps them for the tool-call parser.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS])
    tokenizer.save(str(directory / "tokenizer.json"))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOOLS_CHATML_TEMPLATE
    config_path.write_text(json.dumps(config))
    return directory
