"""Bad input: a clear error naming what was wrong, and the engine keeps generating afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import numpy as np
import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.constrained import ConstraintError
from brisklm.kernels.omp import available_cpus
from brisklm.llm import ContextLengthError
from brisklm.loader import CheckpointError
from tests.tiny import make_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def assert_still_works(llm):
    out = llm.generate("Hello", GREEDY)
    assert len(out.token_ids) == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_params(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    assert_still_works(llm)


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([], GREEDY)
    with pytest.raises(ValueError, match="context"):
        llm.generate(list(range(5, 5 + 200)), GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([[10, 10**6]], GREEDY)
    with pytest.raises(TypeError, match="prompt"):
        llm.generate([3.5], GREEDY)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="SamplingParams for"):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("Hello", SamplingParams(logit_bias={10**6: 1.0}))
    # Validation happens before anything is queued: a batch with one bad prompt runs nothing, and
    # the error says which prompt it was.
    with pytest.raises(ValueError, match="^prompt 1 of 3: the prompt has 295 tokens"):
        llm.generate(["Hello", list(range(5, 300)), "Hi"], GREEDY)
    with pytest.raises(ValueError, match="^prompt 2 of 3: the prompt is empty"):
        llm.generate(["Hello", "Hi", []], GREEDY)
    with pytest.raises(
        TypeError, match="^prompt 1 of 2: params must be a SamplingParams, got dict"
    ):
        llm.generate(["Hello", "Hi"], [GREEDY, {"temperature": 0}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="^the prompt is empty"):  # one prompt: no index
        llm.generate([[]], GREEDY)
    assert not llm.engine.has_unfinished
    assert_still_works(llm)


@pytest.mark.parametrize(
    "prompts, message",
    [
        (None, "prompts must be a str, a list of token ids, or a list of those, got NoneType"),
        (5, "got int"),
        ({"a": 1}, "got dict"),  # was iterated: generated for the prompt "a"
        ({"Hello"}, "got set"),
        (b"hello", r"got bytes \(decode bytes to str first\)"),  # was taken as token ids
        (bytearray(b"hi"), "got bytearray"),
        (memoryview(b"hi"), r"got memoryview \(decode bytes"),  # was read as ids 104, 105
        ([b"hi", b"yo"], r"prompt 0 of the list is b'hi' \(bytes\).* \(decode bytes to str"),
        ([True, 3], r"prompt 0 of the list is True \(bool\)"),
        # These said "a prompt must be a str or a list of token ids, got list / int".
        ([5, "Hi"], r"a prompt given as a list must hold only token ids \(ints\), but item 1 is a"),
        (["Hi", 5], r"prompt 1 of the list is 5 \(int\).* a tokenized prompt is a list of ints"),
        ([5.0, 6.0], r"prompt 0 of the list is 5.0 \(float\)"),
        # These said "prompt 0 of the list is 5.0 (float): a list of prompts holds strs or ...".
        (np.array([5.0, 6.0]), r"token ids must be integers, but the ndarray given holds float64"),
        (torch.tensor([5.0]), r"token ids must be integers, but the Tensor given holds float32"),
        (np.array([True, False]), r"token ids must be integers, but the ndarray given holds bool"),
        ([np.array([5.0])], r"token ids must be integers, but the ndarray given holds float64"),
        # These said "... got int": the scalar had become an int.
        (torch.tensor(5), r"a 0-d Tensor \(tensor\(5\)\) is one token id, not a prompt"),
        (["Hi", np.int64(5)], r"a 0-d int64 \(np.int64\(5\)\) is one token id, not a prompt"),
        ([torch.tensor(5.0)], r"token ids must be integers, but the Tensor given holds float32"),
        # This said "a prompt given as a list must hold only token ids (ints), but item 0 is a list".
        (torch.zeros(2, 2, 2, dtype=torch.long), r"a 3-d Tensor of token ids: give a 1-d one"),
    ],
)
def test_prompts_of_the_wrong_type(llm, prompts, message):
    with pytest.raises(TypeError, match=message):
        llm.generate(prompts, GREEDY)
    assert_still_works(llm)


@pytest.mark.parametrize(
    "prompt", [torch.zeros(0, dtype=torch.long), np.zeros(0, dtype=np.int64)], ids=["torch", "np"]
)
def test_an_empty_1d_array_is_an_empty_prompt(llm, prompt):
    # A 1-d array is one prompt: an empty one said "no prompts given", as an empty list does.
    with pytest.raises(ValueError, match=r"the prompt is empty: the 1-d \w+ given holds no token"):
        llm.generate(prompt, GREEDY)
    assert_still_works(llm)


def test_numpy_and_torch_token_ids_are_prompts(llm):
    # An array of ids was "prompts must be a str, ..., got ndarray"; numpy's int64 items "got int64".
    expected = llm.generate([5, 6, 7], GREEDY).token_ids
    scalars = [torch.tensor(5), torch.tensor(6), np.array(7)]  # 0-d: one id each
    for prompt in (
        np.array([5, 6, 7]),
        torch.tensor([5, 6, 7]),
        [np.int64(5), 6, np.int32(7)],
        scalars,
    ):
        assert llm.generate(prompt, GREEDY).token_ids == expected
    two = llm.generate(np.array([[5, 6, 7], [5, 6, 7]]), GREEDY)
    assert [out.token_ids for out in two] == [expected, expected]
    assert "".join(llm.stream(np.array([5, 6, 7]), GREEDY)) == llm.generate([5, 6, 7], GREEDY).text
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, "):
        llm.generate(np.array([5, -1]), GREEDY)


def test_a_tokenizer_larger_than_the_models_vocabulary(tmp_path, caplog):
    # Tokens added to a tokenizer without resizing the embedding: a text prompt holding one was
    # admitted and then failed inside the engine step, taking its batch partners down with it; an
    # eos id past the vocabulary (generation_config.json) failed every sampled request.
    directory = make_tiny_checkpoint(tmp_path / "small-vocab", vocab_size=300)
    generation = json.loads((directory / "generation_config.json").read_text())
    generation["eos_token_id"] = [*generation["eos_token_id"], 350]
    (directory / "generation_config.json").write_text(json.dumps(generation))
    with LLM.from_pretrained(directory, max_batch_size=2, show_progress=False) as llm:
        text = "Zürich 東京 naïve café"
        _check_small_vocabulary(llm, text)
    assert "eos token id 350 is past the model's vocabulary of 300" in caplog.text
    # With a draft model too: its proposals were sampled against the unfiltered eos ids.
    with LLM.from_pretrained(
        directory, max_batch_size=2, draft=directory, show_progress=False
    ) as llm:
        _check_small_vocabulary(llm, text)


def test_a_constraint_only_ids_past_the_embedding_spell_names_that(tmp_path):
    # A model of 100 ids under a 400-id tokenizer: " " exists only past the embedding, so "a b"
    # cannot be generated; the refusal blamed the constraint alone ("matches no output").
    directory = make_tiny_checkpoint(tmp_path / "tiny-vocab", vocab_size=100)
    with LLM.from_pretrained(directory, max_batch_size=2, show_progress=False) as llm:
        with pytest.raises(
            ConstraintError,
            match=r"matches no output at all .*; or its text needs tokens past the model's "
            r"vocabulary \(the embedding has 100 of the tokenizer's 400 ids\)",
        ):
            llm.generate([5, 6, 7], SamplingParams(max_tokens=20, regex="a b"))
        assert llm.generate([5, 6, 7], SamplingParams(max_tokens=20, regex="a( b)?")).text == "a"


def _check_small_vocabulary(llm: LLM, text: str) -> None:
    assert max(llm.tokenizer.encode(text)) >= 300
    with pytest.raises(
        ValueError,
        match=r"prompt 1 of 2: prompt token ids must be in \[0, 300\) \(the tokenizer has "
        r"tokens the model's embedding lacks\); got \[3",
    ):
        llm.generate([[5, 6, 7], text], GREEDY)
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=4, min_tokens=2)
    outputs = llm.generate([[5, 6, 7], [8, 9]], [sampled, GREEDY])
    assert len(outputs[0].token_ids) >= 2 and len(outputs[1].token_ids) == 4
    # Text a grammar forces is spelled in the ids the model has: the grammar forced the
    # tokenizer's own ids (past the embedding), which failed the request at its next step (an
    # index error; on CUDA a device-side assert that breaks every later request).
    forced = [
        SamplingParams(max_tokens=40, choice=[text]),
        SamplingParams(max_tokens=40, regex=re.escape(text) + " [a-z]{1,3}"),
    ]
    outputs = llm.generate([[5, 6, 7, 5, 6], [8, 9]], forced)
    assert outputs[0].text == text and outputs[1].text.startswith(text + " ")
    for out in outputs:
        assert out.finish_reason == "stop" and max(out.token_ids) < 300, out


def test_a_max_seq_len_whose_kv_cache_cannot_fit_is_refused_before_allocating(tiny_dir):
    # It was the allocator's "DefaultCPUAllocator: can't allocate memory: you tried to allocate
    # ... bytes"; with a draft model, the draft's cache failed first, so the check comes before.
    # Both caches counted in the advice (the target's alone suggested a max_seq_len that then
    # failed with the draft's).
    with pytest.raises(
        ValueError,
        match=r"max_seq_len=1000000000 with max_batch_size=2 needs KV caches \(the model's and its "
        r"draft's\) of [\d.]+ TB \(\d+ bytes a token in float32\), more than the [\d.]+ [GTM]B "
        r"of RAM and swap free now: max_seq_len can be at most \d+ here; the model's "
        r"max_position_embeddings is \d+",
    ):
        LLM.from_pretrained(
            tiny_dir,
            device="cpu",
            max_batch_size=2,
            max_seq_len=10**9,
            draft=tiny_dir,
            show_progress=False,
        )


def test_a_kv_cache_larger_than_the_free_memory_is_refused(tiny_dir, monkeypatch):
    # One between the free memory and the machine's total was granted, then its pages were
    # written: the out-of-memory killer ended the process (or another) without a word.
    from brisklm.engine import llm_engine

    monkeypatch.setattr(llm_engine, "available_memory", lambda device: 10**6)
    with pytest.raises(ValueError, match=r"more than the 1.0 MB of RAM and swap free now"):
        LLM.from_pretrained(tiny_dir, device="cpu", max_seq_len=2048, show_progress=False)


def test_too_many_sequences_for_the_memory_are_told_to_be_fewer(tiny_dir, monkeypatch):
    """The advice was a max_seq_len to lower to, even one under 2 ("at most 0") when it was the
    number of sequences that did not fit."""
    from brisklm.engine import llm_engine
    from brisklm.loader import load_model

    per_token = llm_engine.kv_cache_bytes_per_token(load_model(tiny_dir, show_progress=False))
    monkeypatch.setattr(llm_engine, "available_memory", lambda device: per_token * 1000)
    settings = dict(device="cpu", max_seq_len=300, show_progress=False)
    with pytest.raises(
        ValueError, match=r"free now: max_batch_size at most 3 at this max_seq_len;"
    ):
        LLM.from_pretrained(tiny_dir, max_batch_size=64, **settings)
    with pytest.raises(
        ValueError,
        match=r"free now: max_batch_size \+ prefix_cache_slots at most 3 at this max_seq_len;",
    ):
        LLM.from_pretrained(tiny_dir, max_batch_size=2, prefix_cache_slots=2, **settings)
    # A shorter context for as many sequences, where that is a useful one: both ways.
    with pytest.raises(
        ValueError,
        match=r"free now: max_seq_len can be at most 500 here or max_batch_size at most 1 at",
    ):
        LLM.from_pretrained(tiny_dir, max_batch_size=2, max_seq_len=600, show_progress=False)


def test_a_failed_load_leaves_torch_s_thread_count_and_bad_backends_fail_first(
    tiny_dir, monkeypatch
):
    import torch

    import brisklm.llm

    before = torch.get_num_threads()
    with pytest.raises(ValueError, match="max_seq_len=1000000000"):
        LLM.from_pretrained(tiny_dir, max_seq_len=10**9, num_threads=1, show_progress=False)
    assert torch.get_num_threads() == before
    # Refused before the weights load (it was after), as a bad dtype or device is.
    monkeypatch.setattr(brisklm.llm, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ValueError, match=r"attention_backend must be one of auto, sdpa, xformers"):
        LLM.from_pretrained(tiny_dir, attention_backend="bogus")


def test_the_target_and_draft_caches_must_fit_together(tiny_dir, monkeypatch):
    # Only the target's cache was checked: room for it alone let the draft's be allocated
    # too, past the free memory (on Linux, the out-of-memory killer's business).
    from brisklm.engine import llm_engine
    from brisklm.loader import load_model

    per_token = llm_engine.kv_cache_bytes_per_token(load_model(tiny_dir, show_progress=False))
    free = per_token * 2 * 256 + 1  # the target's cache of 2 x 256 positions, not the draft's
    monkeypatch.setattr(llm_engine, "available_memory", lambda device: free)
    settings = dict(device="cpu", max_batch_size=2, max_seq_len=256, show_progress=False)
    LLM.from_pretrained(tiny_dir, **settings).close()
    with pytest.raises(ValueError, match=r"needs KV caches \(the model's and its draft's\) of "):
        LLM.from_pretrained(tiny_dir, draft=tiny_dir, **settings)
    LLM.from_pretrained(tiny_dir, draft="ngram", **settings).close()


def test_a_kv_cache_the_allocator_refuses_is_a_memory_error_naming_its_size():
    from brisklm.cache.contiguous import KVCache

    # 2**60 bytes a tensor: past any machine's address space, so every allocator refuses it.
    with pytest.raises(
        MemoryError,
        match=r"the KV cache for 1 sequence\(s\) of 1125899906842624 tokens needs 2305843.0 TB "
        r"\(2048 bytes a token in float32\), more than cpu could allocate: lower max_seq_len",
    ):
        KVCache(1, 1, 2**50, 1, 256, torch.float32, "cpu")


@pytest.mark.parametrize(
    "prompt, message",
    [
        # These said "...; a list of prompts is a list of strs or lists of ids: [[1, 2], 'Hi']".
        (["Hi", "Yo"], r"takes one prompt, a str or a list of token ids \(ints\), but item 0 of"),
        (np.array([[5, 6], [7, 8]]), r"takes one prompt, .* but item 0 of the list is a list"),
        ([5, "Hi"], r"takes one prompt, .* item 1 of the list is a str \('Hi'\); generate takes"),
        (np.array([5.0]), r"token ids must be integers, but the ndarray given holds float64"),
    ],
)
async def test_a_stream_takes_one_prompt(llm, prompt, message):
    for call in (llm.stream, llm.stream_chunks, llm.astream, llm.astream_chunks):
        with pytest.raises(TypeError, match=message):
            call(prompt, GREEDY)
    assert_still_works(llm)


def test_params_of_the_wrong_type(llm):
    with pytest.raises(TypeError, match="params must be a SamplingParams, a list of them"):
        llm.generate("Hello", {"temperature": 0})  # its keys were taken as the params list
    with pytest.raises(TypeError, match="got type"):
        llm.generate("Hello", SamplingParams)
    with pytest.raises(TypeError, match="params must be a SamplingParams, got dict"):
        llm.generate(["Hello"], [{"temperature": 0}])
    # `params or defaults`: {} and [] ran with the defaults; with tools on a model whose call
    # tag is a special token, a dict was an AttributeError ('dict' has no 'with_changes').
    messages = [{"role": "user", "content": "Hi"}]
    for call in (
        lambda: llm.stream("Hello", {}),
        lambda: llm.stream_chunks("Hello", []),
        lambda: llm.astream("Hello", {}),
        lambda: llm.chat(messages, {"temperature": 0}),
        lambda: llm.stream_chat(messages, "greedy"),
        lambda: asyncio.run(llm.achat(messages, [GREEDY])),
    ):
        with pytest.raises(TypeError, match="params must be a SamplingParams or None, got"):
            call()
    # Not Requests: AttributeError ('str' object has no attribute 'submitted') from the loop.
    for requests in (["Hello"], [None], [GREEDY]):
        with pytest.raises(TypeError, match=r"requests must be Request objects \(LLM.make_req"):
            llm.run_requests(requests)
    assert_still_works(llm)


def test_min_tokens_past_the_room_the_prompt_leaves(llm):
    prompt = [1] + [5] * (llm.max_seq_len - 4)  # 3 tokens of room
    with pytest.raises(ContextLengthError, match=r"min_tokens=4 cannot be met: .* leaves 3 "):
        llm.generate(prompt, SamplingParams(min_tokens=4, max_tokens=9))
    reply = llm.generate(prompt, SamplingParams(min_tokens=3, max_tokens=9, ignore_eos=True))
    assert len(reply.token_ids) == 3 and reply.finish_reason == "length"
    assert_still_works(llm)


def test_text_that_is_not_unicode(llm):
    with pytest.raises(
        ValueError, match=r"not valid Unicode text: surrogates not allowed at position 0"
    ):
        llm.generate("\ud800abc", GREEDY)
    assert_still_works(llm)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_batch_size": "8"}, "max_batch_size must be an int >= 1, got '8'"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an int >= 1, got 2.5"),
        ({"max_batch_size": True}, "max_batch_size must be an int >= 1, got True"),
        ({"max_seq_len": "100"}, r"max_seq_len must be an int >= 2 or None \(the model's\)"),
        (
            {"draft": "ngram", "num_speculative_tokens": 1.5},
            "num_speculative_tokens must be an int",
        ),
        ({"num_speculative_tokens": -3}, "num_speculative_tokens must be an int"),
        ({"num_speculative_tokens": "abc"}, "num_speculative_tokens must be an int"),
        (  # taken silently, where the CLI refused its flag (found by an audit)
            {"num_speculative_tokens": 3},
            "num_speculative_tokens=3 needs speculative decoding: pass draft=",
        ),
        (  # it read "must be an int >= 1, got np.int64(2)"
            {"max_batch_size": np.int64(2)},
            r"got np.int64\(2\) \(a int64: pass int\(...\) of it\)",
        ),
        ({"show_progress": "no"}, "show_progress must be True or False, got 'no'"),
    ],
)
def test_engine_arguments_of_the_wrong_type(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM.from_pretrained(tiny_dir, **{"show_progress": False, **kwargs})


@pytest.mark.parametrize(
    ("messages", "kwargs", "message"),
    [
        ("Hello", {}, "messages must be a list of message dicts .* got str"),
        ({"role": "user", "content": "Hi"}, {}, "messages must be a list .* got dict"),
        ([], {}, "messages is empty"),
        (
            [{"role": "user", "content": "Hi"}],
            {"add_generation_prompt": False},
            "add_generation_prompt is not a chat option",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"chat_template": "{% if false %}x{% endif %}"},
            "the chat template rendered no tokens",
        ),
    ],
)
def test_bad_chat_calls(llm, messages, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages, GREEDY, **kwargs)
    assert_still_works(llm)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 3}, r"max_tokens=, which is not a chat template variable.*SamplingParams"),
        ({"temperature": 0}, r"temperature=.*params=SamplingParams\(temperature=\.\.\.\)"),
        ({"sampling_params": GREEDY}, r"sampling_params=.*pass it as params="),
    ],
)
@pytest.mark.parametrize("call", ["chat", "stream_chat", "achat"])
def test_sampling_options_given_to_chat_as_keywords_are_refused(llm, kwargs, message, call):
    # The keywords go to the chat template, which ignored them: chat(max_tokens=3) ran to the
    # default length, chat(temperature=0) sampled.
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(TypeError, match=message):
        if call == "achat":
            asyncio.run(llm.achat(messages, **kwargs))
        else:
            getattr(llm, call)(messages, **kwargs)  # stream_chat too: it renders at once
    assert_still_works(llm)


@pytest.mark.parametrize("tools", ["get_weather", {"name": "get_weather"}, 3])
def test_tools_that_are_not_a_list_are_refused_naming_the_type(llm, tools):
    # A str was iterated: the error named its first character ("got 'g'").
    with pytest.raises(ValueError, match=r"tools must be a list of tool definitions .* got "):
        llm.chat([{"role": "user", "content": "Hi"}], GREEDY, tools=tools)
    assert_still_works(llm)


def test_a_template_variable_still_reaches_the_template(llm):
    template = "{{ greeting }} {{ messages[0]['content'] }}"
    ids = llm.chat_prompt_ids(
        [{"role": "user", "content": "Hi"}], chat_template=template, greeting="Hey"
    )
    assert llm.tokenizer.decode(ids) == "Hey Hi"


def test_a_request_runs_once(llm):
    # Submitted twice, a request took two cache slots and freed one: the engine lost a slot for
    # good each time; run again after finishing, it went past max_tokens.
    request = llm.make_request("Hello", GREEDY)
    with pytest.raises(ValueError, match="already submitted: a request runs once"):
        llm.run_requests([request, request])
    assert not request.submitted  # nothing of the refused call was queued
    first = llm.run_requests([request])[0]
    with pytest.raises(ValueError, match=f"request {request.request_id} was already submitted"):
        llm.run_requests([request])
    with pytest.raises(ValueError, match="already submitted"):
        list(llm.stream_request(request))
    assert first.usage.completion_tokens <= GREEDY.max_tokens
    assert_still_works(llm)
    assert llm.engine.scheduler.slots.num_free == llm.engine.config.max_batch_size


def test_abort_given_a_request_instead_of_its_id_says_so(llm):
    # llm.abort(request) matched no id and was ignored: the request ran on to max_tokens.
    request = llm.make_request("Hello", GREEDY)
    with pytest.raises(TypeError, match="abort takes a request id .*pass request.request_id"):
        llm.abort(request)
    with pytest.raises(TypeError, match="abort takes a request id .*got NoneType"):
        llm.abort(None)
    llm.abort("no-such-request")  # an unknown id is still ignored
    assert len(llm.run_requests([request])[0].token_ids) == GREEDY.max_tokens
    assert_still_works(llm)


def test_model_error_fails_only_that_step(llm, monkeypatch):
    runner = llm.engine.runner

    def broken(batch, *greedy_columns):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(runner, "forward", broken)
    monkeypatch.setattr(runner, "forward_greedy", broken)
    with pytest.raises(RuntimeError, match="simulated kernel failure"):
        llm.generate("Hello", GREEDY)
    monkeypatch.undo()
    assert_still_works(llm)
    assert llm.engine.scheduler.slots.num_free == llm.engine.config.max_batch_size


@pytest.mark.parametrize("draft", [None, "ngram"])
def test_an_error_taking_one_rows_token_fails_that_request_alone(tiny_dir, draft):
    """An unexpected error appending one request's token (a bug in its detokenizer or stop rule,
    injected here) failed every request of the step, though theirs were chosen (an audit's)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["Hello there", "Once upon a time", "The quick brown fox"]
    with LLM.from_pretrained(tiny_dir, draft=draft, show_progress=False) as llm:
        alone = [llm.generate(p, params).token_ids for p in prompts]
        requests = [llm.make_request(p, params) for p in prompts]
        detokenizer = requests[1].detokenizer
        add = detokenizer.add

        def broken(token_id: int) -> str:
            if len(requests[1].output_token_ids) > 5:
                raise KeyError("simulated detokenizer bug")
            return add(token_id)

        detokenizer.add = broken

        async def each() -> dict:
            return {i: result async for i, result in llm.arun_requests_each(requests)}

        results = asyncio.run(each())
        assert isinstance(results[1], KeyError) and "simulated" in str(results[1])
        assert [results[0].token_ids, results[2].token_ids] == [alone[0], alone[2]]
        assert requests[1].finish_reason == "error"
        assert not llm.engine.has_unfinished
        assert llm.engine.scheduler.slots.num_free == llm.engine.config.max_batch_size
        assert llm.generate(prompts[1], params).token_ids == alone[1]


def nan_at_token(directory, token: int):
    """The checkpoint in ``directory`` with token ``token``'s embedding all NaN: logits of any
    context holding it are NaN (the output layer is not tied to the embedding)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(directory / "model.safetensors")
    assert "lm_head.weight" in weights  # not tied: other contexts keep finite logits
    weights["model.embed_tokens.weight"][token] = float("nan")
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("draft", [None, "same", "ngram"])
def test_a_sampled_request_whose_logits_are_nan_fails_alone(tmp_path, draft):
    # NaN probabilities used to draw the vocabulary's last id (a padding id here): a token of
    # zero probability, silently. Now the request fails, and the one batched with it goes on.
    directory = nan_at_token(make_tiny_checkpoint(tmp_path / "nan"), 100)
    settings = dict(show_progress=False, max_batch_size=2, max_seq_len=128)
    if draft is not None:
        settings.update(draft=directory if draft == "same" else draft, num_speculative_tokens=3)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    clean = [5, 6, 7, 8]
    with LLM.from_pretrained(directory, **settings) as llm:
        alone = llm.generate(clean, params).token_ids
        requests = [llm.make_request([5, 100, 7], params), llm.make_request(clean, params)]

        async def run():
            return dict([pair async for pair in llm.arun_requests_each(requests)])

        results = asyncio.run(run())
        assert isinstance(results[0], RuntimeError)
        assert re.search(
            r"no token to sample after 0 output tokens: the model's logits hold "
            r"NaN or \+inf there; the request was stopped",
            str(results[0]),
        )
        assert results[1].token_ids == alone
        assert llm.generate(clean, params).token_ids == alone
        assert llm.engine.scheduler.slots.num_free == 2


def test_a_draft_whose_logits_are_nan_proposes_nothing_there(tmp_path):
    # The draft's NaN distribution has no token to propose: the target decodes on its own there.
    target = make_tiny_checkpoint(tmp_path / "target")
    draft = nan_at_token(make_tiny_checkpoint(tmp_path / "draft"), 100)
    settings = dict(show_progress=False, max_batch_size=2, max_seq_len=128)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    with LLM.from_pretrained(target, **settings) as plain:
        expected = plain.generate([5, 6, 100], params).token_ids
    with LLM.from_pretrained(target, draft=draft, num_speculative_tokens=3, **settings) as llm:
        out = llm.generate([5, 6, 100], params)
        assert out.speculative.num_proposed == 0
        assert out.token_ids == expected  # each step draws its token as a plain step does
        assert llm.generate([5, 6, 7], params).speculative.num_proposed > 0


@pytest.mark.usefixtures("without_native_kernels")
def test_a_request_that_overflows_its_float16_cache_spoils_no_later_request(tmp_path):
    # Token 100's values overflow a float16 cache (~8e4 > 65504). A later, shorter request in the
    # same slot, padded beside a longer one, read those stale positions masked (weight 0), and
    # 0 * inf is NaN: its output became token 0 over and over.
    from safetensors.torch import load_file, save_file

    directory = make_tiny_checkpoint(tmp_path / "overflow", initializer_range=0.5)
    weights = load_file(directory / "model.safetensors")
    embeddings = weights["model.embed_tokens.weight"]
    embeddings[:, 0] = 0
    embeddings[100] = 0
    embeddings[100, 0] = 1.0
    weights["model.layers.0.input_layernorm.weight"][0] = 1.0
    weights["model.layers.0.self_attn.v_proj.weight"][:, 0] = 1e4
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    short, long = [5, 6, 7], list(range(20, 40))
    settings = dict(show_progress=False, max_batch_size=2, kv_cache_dtype="float16")
    with LLM.from_pretrained(directory, **settings) as fresh:
        expected = [o.token_ids for o in fresh.generate([short, long], params)]
    with LLM.from_pretrained(directory, **settings) as llm:
        # In slot 0, then freed; its own logits are NaN from the overflow on, which fails it (it
        # wrote token 0 again and again, without an error, before greedy rows checked for NaN).
        with pytest.raises(RuntimeError, match="the model's logits hold NaN"):
            llm.generate([8, 9, 10, 11, 12, 100, 13, 14], params)
        assert [o.token_ids for o in llm.generate([short, long], params)] == expected
    assert expected[0] != [0] * 8


def test_nonexistent_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist|no config.json|tokenizer"):
        LLM.from_pretrained(tmp_path / "nope", show_progress=False)
    # pathlib's own TypeErrors, and "" read as the current directory ("no tokenizer found in .")
    with pytest.raises(TypeError, match=r"model path must be a str or os.PathLike .* got int"):
        LLM.from_pretrained(5, show_progress=False)
    with pytest.raises(TypeError, match="got bytes"):
        LLM.from_pretrained(str(tmp_path).encode(), show_progress=False)
    with pytest.raises(ValueError, match="the model path is empty"):
        LLM.from_pretrained("", show_progress=False)


def test_misused_calls_are_named_and_leave_the_engine_serving(llm):
    """From an audit of the API's misuse: each gave an error from deep inside (or none)."""
    # numpy str scalars were read as token ids: "invalid literal for int() ... np.str_('Hi')"
    expected = [o.text for o in llm.generate(["Hi", "Ho"], GREEDY)]
    assert [o.text for o in llm.generate([np.str_("Hi"), np.str_("Ho")], GREEDY)] == expected
    with pytest.raises(TypeError, match="a list of prompts holds strs or lists of token ids"):
        llm.generate([np.datetime64("2020-01-01")], GREEDY)
    # "object of type 'NoneType' has no len()"
    for run in (llm.run_requests, lambda r: asyncio.run(llm.arun_requests(r))):
        with pytest.raises(TypeError, match="requests must be a list of Request objects"):
            run(None)
        with pytest.raises(TypeError, match="got Request"):
            run(llm.make_request("Hi", GREEDY))
    with pytest.raises(ValueError, match="show_progress must be True or False, got 'yes'"):
        llm.generate("Hi", GREEDY, show_progress="yes")
    with pytest.raises(TypeError, match="add_special_tokens must be True or False, got 'no'"):
        llm.make_request("Hi", GREEDY, add_special_tokens="no")
    with pytest.raises(TypeError, match="chat_template must be a str: the name of one of"):
        llm.chat([{"role": "user", "content": "Hi"}], GREEDY, chat_template=5)
    # "a tool needs a string name: {'type': 'retrieval'}"
    with pytest.raises(ValueError, match="a tool of type 'retrieval' cannot be called under a"):
        llm.chat(
            [{"role": "user", "content": "Hi"}],
            GREEDY,
            tools=[{"type": "retrieval"}],
            tool_choice="auto",
        )
    assert_still_works(llm)


def test_close_given_a_bad_timeout_closes_nothing(tiny_dir):
    # close("x") raised from inside threading's wait, the engine already closed.
    llm = LLM.from_pretrained(tiny_dir, show_progress=False)
    for timeout in ("x", -1, float("nan"), True):
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            llm.close(timeout)
    assert_still_works(llm)
    llm.close(0.5)
    with pytest.raises(RuntimeError, match="the engine is closed"):
        llm.generate("Hi", GREEDY)


def test_a_file_given_as_the_model_or_draft_directory_is_named_as_such(tiny_dir):
    # The model's said "tokenizer directory ... does not exist"; the draft's did not say "draft"
    config_file = tiny_dir / "config.json"
    with pytest.raises(NotADirectoryError, match=r"model directory .*config.json' is a file, not"):
        LLM.from_pretrained(config_file, show_progress=False)
    with pytest.raises(NotADirectoryError, match=r"^draft model directory .* is a file, not"):
        LLM.from_pretrained(tiny_dir, draft=config_file, show_progress=False)
    with pytest.raises(FileNotFoundError, match=r"^draft model directory .*nope' does not exist"):
        LLM.from_pretrained(tiny_dir, draft=tiny_dir / "nope", show_progress=False)


def test_a_chat_template_list_with_malformed_entries_is_named(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "body": "{{ messages }}"}]
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tokenizer_config.json: chat_template, as a list, holds"):
        LLM.from_pretrained(broken, show_progress=False)


def test_missing_config(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    (broken / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM.from_pretrained(broken, show_progress=False)


def test_unsupported_architecture(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        LLM.from_pretrained(broken, show_progress=False)


def test_unknown_rope_type(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    config = json.loads((broken / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "mystery", "rope_theta": 10000.0}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mystery.*default, linear, dynamic, llama3, yarn"):
        LLM.from_pretrained(broken, show_progress=False)


def test_mismatched_tensor_shape(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model\.safetensors.*mlp\.(gate|up|down)_proj.*shape"):
        LLM.from_pretrained(broken, show_progress=False)


def test_truncated_safetensors(tiny_dir, tmp_path):
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        LLM.from_pretrained(broken, show_progress=False)


def test_missing_and_unexpected_tensors(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    tensors = load_file(broken / "model.safetensors")
    tensors.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"missing tensors: model\.layers\.1\.self_attn\.k_proj\.weight"
    ):
        LLM.from_pretrained(broken, show_progress=False)
    tensors["model.layers.1.self_attn.k_proj.weight"] = tensors[
        "model.layers.0.self_attn.k_proj.weight"
    ].clone()
    tensors["model.extra.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: unexpected tensor 'model\.extra\.weight'"
    ):
        LLM.from_pretrained(broken, show_progress=False)
    # An untied head missing says why it is wanted (transformers fills it with random weights).
    tensors.pop("model.extra.weight")
    tensors.pop("lm_head.weight", None)
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    tied = json.loads((broken / "config.json").read_text()).get("tie_word_embeddings", False)
    assert not tied
    with pytest.raises(CheckpointError, match=r"lm_head\.weight \(config\.json's tie_word_emb"):
        LLM.from_pretrained(broken, show_progress=False)
    # (a config without the key: it was said to be false in config.json)
    config = json.loads((broken / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json leaves tie_word_embeddings out, false"):
        LLM.from_pretrained(broken, show_progress=False)


def test_a_tensor_stored_twice_names_both_files(tiny_dir, tmp_path):
    """Shards without an index are read whole: a stray copy of the weights beside them (a
    consolidated file) stores every tensor twice. The error named one file, and not why both
    were read."""
    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    tensors = load_file(broken / "model.safetensors")
    (broken / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    for i, part in enumerate((names[:half], names[half:])):
        shard = {n: tensors[n] for n in part}
        save_file(shard, broken / f"model-0000{i + 1}-of-00002.safetensors")
    save_file(tensors, broken / "consolidated.safetensors")
    with pytest.raises(CheckpointError) as error:
        LLM.from_pretrained(broken, show_progress=False)
    message = str(error.value)
    assert "appears more than once" in message and "consolidated.safetensors" in message
    assert "model-0000" in message and "no model.safetensors.index.json" in message


def test_a_weights_file_that_cannot_be_read_says_why(tiny_dir, tmp_path, monkeypatch):
    """safetensors says "No such file or directory" of a file the process may not read, and "No
    such device" of a directory; a link whose target is gone (a cache snapshot's missing blob)
    is named with its target."""
    from brisklm import loader

    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    weights = broken / "model.safetensors"

    def refused(path, *args, **kwargs):  # (as root, chmod 000 refuses nothing)
        if str(path) == str(weights):
            raise PermissionError(13, "Permission denied")
        return open(path, *args, **kwargs)

    def unreadable(*args, **kwargs):
        raise Exception("No such file or directory: model.safetensors")  # (safetensors' words)

    monkeypatch.setattr(loader, "safe_open", unreadable)
    monkeypatch.setattr(loader, "open", refused, raising=False)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: .*\(Permission denied\)"):
        LLM.from_pretrained(broken, show_progress=False)
    monkeypatch.undo()
    weights.rename(broken / "weights.safetensors")
    (broken / "extra.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"extra\.safetensors: .*\(Is a directory\)"):
        LLM.from_pretrained(broken, show_progress=False)
    (broken / "extra.safetensors").rmdir()
    (broken / "extra.safetensors").symlink_to(broken / "blobs" / "gone")
    with pytest.raises(CheckpointError, match=r"No such file or directory; it is a link to .*gone"):
        LLM.from_pretrained(broken, show_progress=False)


def test_bad_device_and_dtype(tiny_dir):
    with pytest.raises(ValueError, match="dtype"):
        LLM.from_pretrained(tiny_dir, dtype="int8", show_progress=False)
    with pytest.raises(ValueError, match="device"):
        LLM.from_pretrained(tiny_dir, device="tpu", show_progress=False)
    with pytest.raises(ValueError, match="int4_compute_dtype: unsupported dtype 'int8'"):
        LLM.from_pretrained(tiny_dir, int4_compute_dtype="int8", show_progress=False)


def test_context_past_the_models_positions_is_warned(tiny_dir, caplog):
    with caplog.at_level("WARNING", logger="brisklm"):
        with LLM.from_pretrained(tiny_dir, max_seq_len=4096, show_progress=False) as llm:
            assert llm.max_seq_len == 4096
    assert any("past the model's max_position_embeddings" in r.getMessage() for r in caplog.records)


def test_streams_check_their_input_at_the_call(tiny_dir):
    llm = LLM.from_pretrained(tiny_dir, show_progress=False)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.stream([], GREEDY)  # before: only at the first next()
    with pytest.raises(TypeError, match="prompt"):
        llm.astream(3.5)  # type: ignore[arg-type]
    stream = llm.stream("Hello", GREEDY)  # nothing runs until it is iterated
    assert not llm.engine.has_unfinished
    assert len("".join(stream)) > 0
    llm.close()
    with pytest.raises(RuntimeError, match="closed"):
        llm.stream("Hello", GREEDY)
    with pytest.raises(RuntimeError, match="closed"):
        llm.astream_chunks("Hello", GREEDY)


def test_num_threads(tiny_dir):
    before = torch.get_num_threads()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_threads must be None or an int >= 1"):
            LLM.from_pretrained(tiny_dir, num_threads=bad, show_progress=False)
    # Far more than the CPUs: OpenMP's thread creation failed, or the process crashed.
    cpus = available_cpus()
    with pytest.raises(ValueError, match=rf"at most {8 * cpus} \(more threads than CPUs"):
        LLM.from_pretrained(tiny_dir, num_threads=8 * cpus + 1, show_progress=False)
    assert torch.get_num_threads() == before  # refused before anything changed
    try:
        with LLM.from_pretrained(tiny_dir, num_threads=1, show_progress=False) as llm:
            assert torch.get_num_threads() == 1
            assert (
                len(llm.generate("Hi", SamplingParams(max_tokens=3, ignore_eos=True)).token_ids)
                == 3
            )
    finally:
        torch.set_num_threads(before)


def test_more_threads_than_cpus_are_warned_of(tiny_dir, caplog):
    from brisklm.kernels.omp import available_cpus

    before = torch.get_num_threads()
    many = available_cpus() + 1
    try:
        with caplog.at_level("WARNING", logger="brisklm"):
            LLM.from_pretrained(tiny_dir, num_threads=many, show_progress=False).close()
        assert f"num_threads={many} is more than the {many - 1} CPUs" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING", logger="brisklm"):
            LLM.from_pretrained(tiny_dir, num_threads=many - 1, show_progress=False).close()
        assert "num_threads" not in caplog.text
    finally:
        torch.set_num_threads(before)


def test_an_llm_cannot_be_pickled_or_copied(llm):
    # pickle (a process pool's argument) failed on a ctypes pointer deep in the engine;
    # copy.copy gave a second handle whose close() closed the original.
    import copy
    import pickle

    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="an LLM cannot be pickled or copied"):
            attempt(llm)
    assert_still_works(llm)


@pytest.mark.parametrize("where", ["mlp", "head"])
def test_nan_logits_fail_a_greedy_request_as_a_sampled_one(tiny_dir, tmp_path, where):
    """A greedy row took the first NaN as the largest logit (torch's argmax, which the kernels'
    argmax followed): a model whose logits were all NaN wrote token 0 again and again with no
    error, where a sampled request failed saying so. Every path now fails it: the kernels' greedy
    pass and steps, torch's sampler (logprobs), and speculative verification."""
    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    weights = load_file(str(broken / "model.safetensors"))
    name = "layers.1.mlp.down_proj" if where == "mlp" else "lm_head"
    key = next(k for k in weights if name in k)
    weights[key][7] = float("nan")  # the down projection's output 7, or token 7's head row
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    message = "no token to sample after 0 output tokens: the model's logits hold NaN"
    cases = [
        ({}, SamplingParams(temperature=0.0, max_tokens=8)),
        ({"max_decode_steps": 1}, SamplingParams(temperature=0.0, max_tokens=8)),
        ({}, SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)),
        ({}, SamplingParams(temperature=0.8, seed=3, max_tokens=8)),
        ({"draft": tiny_dir}, SamplingParams(temperature=0.0, max_tokens=8)),
    ]
    for settings, params in cases:
        llm = LLM.from_pretrained(broken, show_progress=False, **settings)
        try:
            with pytest.raises(RuntimeError, match=message):
                llm.generate("hello there", params)
            assert not llm.engine.has_unfinished
        finally:
            llm.close()


@pytest.mark.parametrize(
    "decoder",
    [{"3": "<|im_start|>"}, {"3": None}, {"3": 7}, {"x": {"content": "<a>"}}, ["<|im_start|>"]],
)
def test_a_malformed_added_tokens_decoder_is_named(tiny_dir, tmp_path, decoder):
    # A str entry crashed with AttributeError ('str' object has no attribute 'content'), which
    # the CLI printed as a traceback (found by a type-checker triage).
    broken = shutil.copytree(tiny_dir, tmp_path / "m")
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = decoder
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tokenizer_config.json: added_tokens_decoder"):
        LLM.from_pretrained(broken, show_progress=False)
