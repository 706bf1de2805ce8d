"""Whether the bundled default model is there, for the tests that run it."""

from __future__ import annotations

import os

from brisklm import default_model_path

# The bundled model is committed (src/brisklm/assets/brisk-chat/): a missing model fails these tests
# instead of skipping them.
REQUIRE_BUNDLED_MODEL = True

# Runs the bundled-model tests against another checkpoint instead (e.g. to try them on a tiny one).
MODEL_OVERRIDE_ENV_VAR = "BRISKLM_LANGCHAIN_TEST_MODEL"

BUNDLED_MODEL_REASON = (
    "the bundled default model (src/brisklm/assets/brisk-chat/) is not there yet; "
    f"set {MODEL_OVERRIDE_ENV_VAR}=<checkpoint dir> to run these tests on another model"
)


def model_under_test() -> str | None:
    """The checkpoint the bundled-model tests run: the override, else None (the bundled model)."""
    return os.environ.get(MODEL_OVERRIDE_ENV_VAR) or None


def model_under_test_path() -> str:
    """The directory of the model the bundled-model tests run."""
    return model_under_test() or str(default_model_path())


def bundled_model_available() -> bool:
    if REQUIRE_BUNDLED_MODEL or model_under_test():
        return True
    try:
        default_model_path()
    except FileNotFoundError:
        return False
    return True
