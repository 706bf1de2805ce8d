"""brisklm: a local LLM inference engine for Llama-family models."""

from typing import TYPE_CHECKING

from brisklm._lazy import lazy_attributes

if TYPE_CHECKING:
    from brisklm.config import ModelConfig
    from brisklm.constrained.errors import ConstraintError
    from brisklm.constrained.spec import (
        AfterThinking,
        Choice,
        Grammar,
        JsonObject,
        JsonSchema,
        Regex,
    )
    from brisklm.engine.llm_engine import EngineConfig
    from brisklm.llm import LLM, ContextLengthError, default_model_path
    from brisklm.outputs import ChatOutput, GenerationOutput, StreamChunk, TokenLogprob, Usage
    from brisklm.sampling import SamplingParams
    from brisklm.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "AfterThinking",
    "ChatOutput",
    "Choice",
    "ConstraintError",
    "ContextLengthError",
    "EngineConfig",
    "GenerationOutput",
    "Grammar",
    "JsonObject",
    "JsonSchema",
    "ModelConfig",
    "Regex",
    "SamplingParams",
    "StreamChunk",
    "TokenLogprob",
    "Tokenizer",
    "Usage",
    "default_model_path",
]

# Imported on first use, so that `import brisklm` and the CLI's `--help` do not load torch.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "ModelConfig": "brisklm.config",
        # SamplingParams(constraint=...) and the error a constraint raises
        "ConstraintError": "brisklm.constrained.errors",
        "AfterThinking": "brisklm.constrained.spec",
        "Choice": "brisklm.constrained.spec",
        "Grammar": "brisklm.constrained.spec",
        "JsonObject": "brisklm.constrained.spec",
        "JsonSchema": "brisklm.constrained.spec",
        "Regex": "brisklm.constrained.spec",
        "EngineConfig": "brisklm.engine.llm_engine",
        "LLM": "brisklm.llm",
        "ContextLengthError": "brisklm.llm",
        "default_model_path": "brisklm.llm",
        "ChatOutput": "brisklm.outputs",
        "GenerationOutput": "brisklm.outputs",
        "StreamChunk": "brisklm.outputs",
        "TokenLogprob": "brisklm.outputs",
        "Usage": "brisklm.outputs",
        "SamplingParams": "brisklm.sampling",
        "Tokenizer": "brisklm.tokenizer",
    },
)
