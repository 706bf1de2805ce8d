"""The README's LangChain example runs as written on the bundled model."""

from __future__ import annotations

import pytest

from tests.integrations.langchain.bundled import model_under_test_path
from tests.readme_examples import run_blocks

pytestmark = pytest.mark.bundled_model


def test_the_langchain_example_runs():
    namespace = run_blocks("LangChain", model_under_test_path())
    chat = namespace["chat"]
    assert chat.model == model_under_test_path()
    person = chat.with_structured_output(namespace["Person"]).invoke("Ada is 36.")
    assert isinstance(person, namespace["Person"])  # as the example's last line returns
    calls = namespace["with_tools"].invoke("Weather in Paris?").tool_calls
    assert all(call["name"] == "GetWeather" and "city" in call["args"] for call in calls)
