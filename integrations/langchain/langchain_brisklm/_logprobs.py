"""Token logprobs in the shapes OpenAI's LangChain classes report them (brisklm's own: the server
reports them alike)."""

from brisklm.openai_format import chat_logprobs, completion_logprobs

__all__ = ["chat_logprobs", "completion_logprobs"]
