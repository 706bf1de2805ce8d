"""brisklm: a local LLM inference engine for Llama-family models."""

from brisklm.config import ModelConfig
from brisklm.engine.llm_engine import EngineConfig
from brisklm.llm import LLM, default_model_path
from brisklm.outputs import ChatOutput, GenerationOutput, StreamChunk, TokenLogprob, Usage
from brisklm.sampling import SamplingParams
from brisklm.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "ChatOutput",
    "EngineConfig",
    "GenerationOutput",
    "ModelConfig",
    "SamplingParams",
    "StreamChunk",
    "TokenLogprob",
    "Tokenizer",
    "Usage",
    "default_model_path",
]
