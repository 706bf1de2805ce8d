"""brisklm: a local LLM inference engine for Llama-family models."""

__version__ = "0.1.0"
