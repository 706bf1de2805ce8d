"""LangChain integration for brisklm: ChatBrisk (chat model) and BriskLLM (completion model)."""

from langchain_brisklm._engines import close_engines
from langchain_brisklm.chat_models import ChatBrisk
from langchain_brisklm.llms import BriskLLM

__version__ = "0.1.0"

__all__ = ["BriskLLM", "ChatBrisk", "close_engines"]
