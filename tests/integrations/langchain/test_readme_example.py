"""The README's LangChain example runs as written on the bundled model."""

from __future__ import annotations

import pytest

from tests.integrations.langchain.bundled import model_under_test, model_under_test_path
from tests.readme_examples import run_blocks

pytestmark = pytest.mark.bundled_model


def test_the_langchain_example_runs():
    namespace = run_blocks("LangChain", model_under_test_path())
    chat = namespace["chat"]
    assert chat.model == model_under_test_path()
    person = namespace["person"]
    assert isinstance(person, namespace["Person"])
    calls = namespace["with_tools"].invoke("Weather in Paris?").tool_calls
    assert all(call["name"] == "GetWeather" and "city" in call["args"] for call in calls)
    if model_under_test() is None:
        # What the example's comments say the bundled model answers (the README's examples were
        # requests it was not trained for, and it answered nonsense: found by an audit).
        assert person == namespace["Person"](name="Ada Lovelace", age=36)
        assert calls[0]["args"] == {"city": "Paris"}
        assert chat.invoke("Hello!").content == "Hello! How can I help you today?"
        reply = "".join(c.content for c in chat.stream("What is the capital of France?"))
        assert reply == "The capital of France is Paris."
