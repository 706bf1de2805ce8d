"""The README's Python API and speculative-decoding examples run as written on the bundled models."""

from __future__ import annotations

import pytest

from brisklm import LLM, SamplingParams, default_model_path
from tests.readme_examples import python_blocks, run_blocks

pytestmark = pytest.mark.bundled_model


def test_the_python_api_example_runs(capsys):
    namespace = run_blocks("Python API", str(default_model_path()))
    out, outs, reply = namespace["out"], namespace["outs"], namespace["reply"]
    assert len(outs) == 2 and out.usage.completion_tokens >= 1
    story = namespace["story"]  # n=3: three completions, seeded apart
    assert len(story.choices) == 3 and len({c.text for c in story.choices}) > 1
    # What the example's comments say the bundled model writes (the examples were requests it was
    # not trained for, and it answered nonsense: found by an audit).
    person = namespace["Person"].model_validate_json(namespace["person"].content)  # constrained
    assert person == namespace["Person"](name="Ada Lovelace", age=36)
    assert (reply.content, reply.tool_calls) == ("The capital of France is Paris.", [])
    assert out.text.startswith(", there was a little")
    assert all(o.text.strip() for o in outs)
    scored = namespace["scored"]  # prompt logprobs: an entry per prompt token, the first None
    assert len(scored.prompt_logprobs) == len(scored.prompt_token_ids) > 1
    assert scored.prompt_logprobs[0] is None and all(
        e.logprob <= 0 for e in scored.prompt_logprobs[1:]
    )
    assert namespace["llm"]._loop.closed  # the example ends with llm.close()
    assert "Usage(" in capsys.readouterr().out


def test_the_speculative_decoding_example_runs():
    names = {
        "LLM": LLM,
        "target_dir": default_model_path(),
        "draft_dir": default_model_path(draft=True),
        "prompt": "Hello!",
        "params": SamplingParams(temperature=0, max_tokens=12),
    }
    namespace = run_blocks("Speculative decoding", "", names)
    assert namespace["out"].speculative is not None
    assert 0 <= namespace["out"].speculative.acceptance_rate <= 1
    namespace["llm"].close()


def test_each_example_section_is_found():
    for section in ("Python API", "Speculative decoding", "LangChain"):
        assert python_blocks(section)
