"""training/usage_checks.py: its tools are the examples' and the README's as LangChain sends them,
and the model under test answers the requests the docs make of it as the docs say."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel

from brisklm import LLM
from tests.integrations.langchain.bundled import model_under_test_path
from tests.readme_examples import python_blocks
from training import usage_checks

ROOT = Path(__file__).resolve().parents[3]


def test_agent_tools_are_the_examples() -> None:
    spec = importlib.util.spec_from_file_location("agent_tools", ROOT / "examples/agent_tools.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert [convert_to_openai_tool(t) for t in example.TOOLS.values()] == usage_checks.AGENT_TOOLS


def test_readme_tool_is_the_readmes() -> None:
    code = "\n".join(python_blocks("LangChain"))
    found = re.search(r"^class GetWeather\(BaseModel\):\n(?:    .*\n)+", code, re.M)
    assert found, "the README's LangChain example no longer defines GetWeather"
    namespace: dict = {"BaseModel": BaseModel}
    exec(found.group(0), namespace)
    assert [convert_to_openai_tool(namespace["GetWeather"])] == usage_checks.README_TOOLS


def test_checks_expect_calls_of_offered_tools() -> None:
    for check in usage_checks.CHECKS:
        names = [t["function"]["name"] for t in usage_checks.TOOL_SETS[check.tools]]
        assert check.call is None or check.call[0] in names, check


@pytest.mark.bundled_model
def test_model_answers_the_docs_requests() -> None:
    llm = LLM.from_pretrained(model_under_test_path(), dtype="float32", show_progress=False)
    try:
        result = usage_checks.score(llm)
    finally:
        llm.close()
    missed = [c for c in result["checks"] if not c["ok"] and not c["known_miss"]]
    assert not missed, missed
    # A known miss now right makes examples/agent_tools.py's docstring stale: update it and the
    # check's known_miss together.
    assert result["known_misses_now_right"] == []


def test_a_call_cut_off_is_no_text_answer() -> None:
    # A reply to "Hello!" that starts a call max_tokens cuts off parses to no calls and its text:
    # it passed as a text answer
    from types import SimpleNamespace

    from brisklm.tool_calls import TOOL_CALL_START

    cut = f'{TOOL_CALL_START}\n{{"name": "get_weather", "arguments": {{"city": "Lo'

    class Stub:
        tokenizer = SimpleNamespace(token_to_id=lambda text: 7)

        def chat_prompt_ids(self, messages: list, tools: list) -> list[int]:
            return [1, 2]

        def generate(self, prompt: list[int], params: object) -> SimpleNamespace:
            top = SimpleNamespace(top=[SimpleNamespace(token_id=7, logprob=-0.1)])
            return SimpleNamespace(text=cut, logprobs=[top])

    result = usage_checks.score(Stub())
    assert not any(c["ok"] for c in result["checks"] if c["expected"] == "text")
