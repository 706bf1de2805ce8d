"""The brisk chat format: special tokens, the ChatML + tool-call jinja template, and a renderer.

The renderer compiles the template exactly as transformers' ``apply_chat_template`` does
(sandboxed jinja2, ``trim_blocks``/``lstrip_blocks``, a ``tojson`` filter that is plain
``json.dumps`` with ``ensure_ascii=False``), so training text matches what transformers and
brisklm render at inference time. ``training/evaluate.py`` checks the two agree.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

# Order fixes the ids 0..4 in the trained tokenizer.
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Added but not "special": decode(skip_special_tokens=True) keeps them, so a tool-call parser sees them.
ADDED_TOKENS = [TOOL_CALL_START, TOOL_CALL_END]

TOOLS_INSTRUCTION = (
    'To call a tool, reply with <tool_call></tool_call> around JSON with "name" and "arguments".'
)

# Whitespace control: transformers compiles with trim_blocks=True and lstrip_blocks=True, and every
# tag below also strips with "-", so the template renders the same with or without those options.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- endif -%}"
    "{{- 'You can call these tools:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}"
    "{%- if tool['function'] is defined -%}{%- set tool = tool['function'] -%}{%- endif -%}"
    "{{- tool | tojson -}}{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- '</tools>\\n" + TOOLS_INSTRUCTION.replace("\n", "\\n") + "<|im_end|>\\n' -}}"
    "{%- elif ns.system -%}"
    "{{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- if tool_call['function'] is defined -%}{%- set tool_call = tool_call['function'] -%}{%- endif -%}"
    "{%- if loop.index0 > 0 or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (tool_call['name'] | tojson) + ', \"arguments\": ' -}}"
    "{%- if tool_call['arguments'] is string -%}{{- tool_call['arguments'] -}}"
    "{%- elif tool_call['arguments'] is defined and tool_call['arguments'] is not none -%}"
    "{{- tool_call['arguments'] | tojson -}}"
    "{%- else -%}{{- '{}' -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if message['content'] is string -%}"
    "{{- '<|im_start|>tool\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>tool\\n' + (message['content'] | tojson) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

ASSISTANT_HEADER = IM_START + "assistant\n"


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Same signature and behaviour as transformers' override of jinja's tojson.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=4)
def _compiled(template: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render a conversation to text with the brisk chat template."""
    return _compiled(CHAT_TEMPLATE).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The text of one tool call as the template renders it (without separators)."""
    return (
        TOOL_CALL_START
        + "\n"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "\n"
        + TOOL_CALL_END
    )
