"""langchain-tests' standard integration tests for ChatBrisk, run offline on the bundled default model.

Skipped while the bundled model is absent (see bundled.py); set BRISKLM_LANGCHAIN_TEST_MODEL to a
checkpoint directory to run them on another model.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_brisklm import ChatBrisk
from tests.integrations.langchain.bundled import model_under_test, model_under_test_path

pytestmark = pytest.mark.bundled_model

# Why the bundled model fails the content checks below (named in the README as the suite's xfails).
REPEATS_CALL = (
    "bundled model: repeats the forced call (two identical calls where one is expected) and, for "
    "'magic_function(3)', does not copy the argument from call notation it was not trained on"
)
UNICODE_ARGUMENT = (
    "bundled model: answers in text instead of calling the tool with the unicode argument"
)
JSON_MODE_KEYS = "bundled model: in JSON mode writes other keys than the joke's setup and punchline"


class TestChatBriskIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatBrisk]:
        return ChatBrisk

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Greedy, so every run of the suite sees the same replies.
        return {"model": model_under_test(), "temperature": 0, "max_tokens": 256}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        # Text blocks with cache_control, thinking blocks and tool_use blocks are all read (the
        # test sends no images to a model without image inputs).
        return True

    @property
    def model_override_value(self) -> str:
        # A per-call model= names a checkpoint directory; the same model by its path is a real
        # override of the name (and loads no second copy: engines are shared by resolved path).
        return model_under_test_path()

    # The tests below check what the model writes, and the bundled 11M-parameter model gets these
    # out-of-distribution prompts wrong (training/README.md has its held-out scores). The adapter
    # paths they exercise (tool binding, forced tool choice, tool messages, JSON mode, unicode
    # arguments) are covered by the unit tests with a scripted model (tests/integrations/langchain/
    # test_chat_tools.py, test_chat_structured.py), and every output is still valid by construction.
    @pytest.mark.xfail(reason=REPEATS_CALL)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: BaseChatModel) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=REPEATS_CALL)
    async def test_tool_calling_async(self, model: BaseChatModel) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=REPEATS_CALL)
    def test_tool_calling_with_no_arguments(self, model: BaseChatModel) -> None:
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(reason=REPEATS_CALL)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=UNICODE_ARGUMENT)
    def test_unicode_tool_call_integration(self, model: BaseChatModel) -> None:
        super().test_unicode_tool_call_integration(model)

    @pytest.mark.xfail(reason=JSON_MODE_KEYS)
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)
