"""The requests that brisklm's README, examples and docstrings make of the bundled target.

The held-out tasks of ``evaluate.py`` measure skills on thousands of made-up tools; a user first
meets the model through a handful of fixed requests: ``examples/agent_tools.py``'s weather question
and its two tools, the README's ``GetWeather`` call, "Hello!" with tools offered. A target can gain
on every held-out task and still lose one of these (session 49's small-talk runs answered "What is
the weather in Paris?" in text), so ``evaluate.py`` scores them too, each with its margin: the
probability of ``<tool_call>`` as the first token without a grammar. A check whose ``known_miss``
is set is one the shipped target gets wrong and the docs say so (``examples/agent_tools.py``'s
docstring); a model that gets it right makes that sentence stale.

    python -m training.usage_checks [--target DIR]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _tool(name: str, description: str, arg: str, arg_type: str) -> dict[str, Any]:
    """One tool in the form LangChain's ``convert_to_openai_tool`` gives it."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "properties": {arg: {"type": arg_type}},
                "required": [arg],
                "type": "object",
            },
        },
    }


# examples/agent_tools.py's two tools and the README's GetWeather, as ChatBrisk.bind_tools sends
# them (tests/test_usage_checks.py checks that they still are).
AGENT_TOOLS = [
    _tool("get_weather", "Get the current weather in a city.", "city", "string"),
    _tool(
        "celsius_to_fahrenheit",
        "Convert a temperature from degrees Celsius to degrees Fahrenheit.",
        "celsius",
        "number",
    ),
]
README_TOOLS = [_tool("GetWeather", "Get the weather for a city.", "city", "string")]
TOOL_SETS = {"agent_tools": AGENT_TOOLS, "readme": README_TOOLS}


@dataclass(frozen=True)
class Check:
    """A user message, the tools offered (a key of TOOL_SETS), and what the answer must be: the
    one call ``(name, arguments)``, or text (``call`` None)."""

    request: str
    tools: str
    call: tuple[str, dict[str, Any]] | None
    source: str
    known_miss: bool = False


def _weather(city: str) -> tuple[str, dict[str, Any]]:
    return ("get_weather", {"city": city})


CHECKS = [
    Check("Please get the weather for Paris.", "agent_tools", _weather("Paris"), "agent_tools.py"),
    Check("What is the weather in Paris?", "agent_tools", _weather("Paris"), "agent_tools.py"),
    Check("Get the weather for Paris.", "agent_tools", _weather("Paris"), "agent_tools.py"),
    Check("What's the weather like in Tokyo?", "agent_tools", _weather("Tokyo"), "README"),
    Check(
        "Convert 30 degrees Celsius to Fahrenheit.",
        "agent_tools",
        ("celsius_to_fahrenheit", {"celsius": 30}),
        "agent_tools.py",
    ),
    Check("How is the weather in Oslo?", "agent_tools", _weather("Oslo"), "agent_tools.py", True),
    Check("Is it raining in Tokyo?", "agent_tools", _weather("Tokyo"), "agent_tools.py", True),
    Check("Hello!", "agent_tools", None, "training/README.md"),
    Check("Thanks!", "agent_tools", None, "training/README.md"),
    Check("What is the capital of France?", "agent_tools", None, "test_bundled_models.py"),
    Check("Weather in Paris?", "readme", ("GetWeather", {"city": "Paris"}), "README"),
    Check("Hello!", "readme", None, "README"),
]


def score(llm: Any) -> dict[str, Any]:
    """Each check through ``llm`` (a brisklm ``LLM``): greedy under ``tool_call_grammar(tools,
    "auto")`` as ``ChatBrisk.bind_tools`` decodes, and P(``<tool_call>`` first) without it."""
    from brisklm import SamplingParams
    from brisklm.tool_calls import TOOL_CALL_START, parse_tool_calls, tool_call_grammar
    from training.evaluate import same_value

    call_token = llm.tokenizer.token_to_id(TOOL_CALL_START)
    if call_token is None:
        raise ValueError(f"{TOOL_CALL_START!r} is not a token of this tokenizer")
    results = []
    for c in CHECKS:
        tools = TOOL_SETS[c.tools]
        prompt = llm.chat_prompt_ids([{"role": "user", "content": c.request}], tools)
        out = llm.generate(
            prompt,
            SamplingParams(
                temperature=0.0, max_tokens=60, grammar=tool_call_grammar(tools, "auto")
            ),
        )
        content, calls = parse_tool_calls(out.text)
        if c.call is None:  # a text answer: a call cut off by max_tokens is none
            ok = not calls and bool(content.strip()) and TOOL_CALL_START not in out.text
        else:
            ok = len(calls) == 1 and same_value(
                {"name": calls[0].name, "arguments": calls[0].arguments},
                {"name": c.call[0], "arguments": c.call[1]},
            )
        first = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1, logprobs=20))
        top = {t.token_id: t.logprob for t in first.logprobs[0].top}
        # Not among the top 20: below the 20th, reported as 0.
        p_call = math.exp(top[call_token]) if call_token in top else 0.0
        results.append(
            {
                "request": c.request,
                "tools": c.tools,
                "expected": "text"
                if c.call is None
                else {"name": c.call[0], "arguments": c.call[1]},
                "got": out.text,
                "ok": ok,
                "p_call": round(p_call, 4),
                "known_miss": c.known_miss,
                "source": c.source,
            }
        )
    must = [r for r in results if not r["known_miss"]]
    return {
        "passed": sum(r["ok"] for r in must),
        "of": len(must),
        "known_misses_now_right": [r["request"] for r in results if r["known_miss"] and r["ok"]],
        "checks": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", type=Path, default=Path("src/brisklm/assets/brisk-chat"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from brisklm import LLM

    torch.set_num_threads(args.threads)
    llm = LLM.from_pretrained(args.target, dtype="float32", show_progress=False)
    try:
        res = score(llm)
    finally:
        llm.close()
    for r in res["checks"]:
        mark = "ok  " if r["ok"] else ("miss" if not r["known_miss"] else "known miss")
        print(
            f"{mark:10} P(call) {r['p_call']:.2f}  [{r['tools']}] {r['request']!r} -> {r['got']!r}"
        )
    print(json.dumps({k: v for k, v in res.items() if k != "checks"}))


if __name__ == "__main__":
    main()
