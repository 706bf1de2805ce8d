"""langchain-tests' standard unit tests for ChatBrisk (construction, binding, serialization: no model runs)."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.load import dumpd, load
from langchain_tests.unit_tests import ChatModelUnitTests
from syrupy.assertion import SnapshotAssertion

from langchain_brisklm import ChatBrisk

# Unit tests never generate, and construction loads nothing, so the model need not exist.
UNIT_MODEL = "models/brisk-unit-test"


class TestChatBriskUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatBrisk]:
        return ChatBrisk

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": UNIT_MODEL}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return {"BRISKLM_MODEL": "models/from-env"}, {}, {"model": "models/from-env"}

    @pytest.mark.xfail(
        reason="langchain-core's load() revives only its own allowlist of partner classes, even "
        "with allowed_objects='all'; test_serialization_round_trip runs the same round trip "
        "allowing ChatBrisk explicitly",
        raises=ValueError,
        strict=True,
    )
    def test_serdes(self, model: BaseChatModel, snapshot: SnapshotAssertion) -> None:
        super().test_serdes(model, snapshot)

    def test_serialization_round_trip(
        self, model: BaseChatModel, snapshot: SnapshotAssertion
    ) -> None:
        with mock.patch.dict(os.environ, self.init_from_env_params[0]):
            serialized = dumpd(model)
            assert serialized == snapshot(name="serialized")
            revived = load(
                serialized,
                valid_namespaces=model.get_lc_namespace()[:1],
                allowed_objects=[self.chat_model_class],
            )
            assert model.dict() == revived.dict()
