"""The LangChain adapter's overhead: ChatBrisk invoke/stream/batch vs the direct brisklm calls, in one run.

Both sides run the same loaded engine (ChatBrisk shares engines by model path), the same prompts and
greedy decoding, so they generate the same tokens; the ratio of their tokens/s is what the adapter
costs (message conversion, template, output parsing, LangChain callbacks and chunk objects).

    python bench/langchain_overhead.py                      # the bundled model (a random one if absent)
    python bench/langchain_overhead.py --model CHECKPOINT_DIR --device cuda
    python bench/langchain_overhead.py --preset tiny        # a 2-layer random model: worst case
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from langchain_core.messages import HumanMessage, SystemMessage

from brisklm import LLM, SamplingParams, default_model_path
from langchain_brisklm import ChatBrisk
from langchain_brisklm._engines import get_engine

PROMPTS = [
    "Tell me a short story about a blue cat.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a tokenizer does.",
    "List three colours.",
    "How are you today?",
    "Describe a rainy day in Tokyo.",
    "Say hello in three languages.",
]
SYSTEM = "You are Brisk, a small and helpful assistant."
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PRESETS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "small": dict(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8
    ),
}


def write_random_chat_checkpoint(directory: Path, preset: str) -> Path:
    """A random Llama with a byte-level BPE tokenizer and a ChatML template."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<unk>", "<s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([SYSTEM, *PROMPTS] * 20, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": CHATML}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    settings = PRESETS[preset]
    model_config = transformers.LlamaConfig(
        **settings,
        num_key_value_heads=settings["num_attention_heads"] // 2,
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=2048,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(model_config).save_pretrained(directory)
    return directory


def rates(
    direct: Callable[[], int], adapter: Callable[[], int], repeats: int
) -> tuple[float, float]:
    """Median generated tokens/s of each side; the runs alternate, so drift in the machine's load
    hits both sides alike. Each callable returns the number of tokens it generated."""
    direct(), adapter()  # warm up: compiled grammars, allocator, first-call imports
    measured: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for side, run in zip(measured, (direct, adapter)):
            start = time.perf_counter()
            tokens = run()
            side.append(tokens / (time.perf_counter() - start))
    return statistics.median(measured[0]), statistics.median(measured[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: bundled)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="random model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    scratch = tempfile.TemporaryDirectory()
    model = args.model
    if model is None and args.preset is None:
        try:
            model = str(default_model_path())
        except FileNotFoundError:
            args.preset = "small"
    if model is None:
        model = str(write_random_chat_checkpoint(Path(scratch.name), args.preset))

    # Repeated prompts: time their compute (the prefix cache would serve them).
    llm: LLM = get_engine(model, device=args.device, prefix_caching=False)
    chat = ChatBrisk(
        model=model,
        device=args.device,
        temperature=0,
        max_tokens=args.max_tokens,
        prefix_caching=False,
    )
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    conversations = [[SystemMessage(SYSTEM), HumanMessage(p)] for p in PROMPTS]
    dicts = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for p in PROMPTS
    ]

    def direct_chat() -> int:
        return sum(llm.chat(d, params).usage.completion_tokens for d in dicts)

    def adapter_invoke() -> int:
        return sum(chat.invoke(c).usage_metadata["output_tokens"] for c in conversations)

    def direct_stream() -> int:
        count = 0
        for d in dicts:
            for chunk in llm.stream_chunks(llm.chat_prompt_ids(d), params):
                count += len(chunk.token_ids)
        return count

    def adapter_stream() -> int:
        count = 0
        for c in conversations:
            for chunk in chat.stream(c):
                if chunk.usage_metadata:
                    count += chunk.usage_metadata["output_tokens"]
        return count

    def direct_batch() -> int:
        outputs = llm.generate([llm.chat_prompt_ids(d) for d in dicts], params)
        return sum(o.usage.completion_tokens for o in outputs)

    def adapter_batch() -> int:
        return sum(m.usage_metadata["output_tokens"] for m in chat.batch(conversations))

    # Same tokens on both sides, or the comparison would mean nothing.
    assert [llm.chat(d, params).content for d in dicts] == [
        chat.invoke(c).content for c in conversations
    ]
    print(
        f"model: {model} on {args.device} ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})"
    )
    print(f"{len(PROMPTS)} prompts, greedy, max_tokens={args.max_tokens}, median of {args.repeats}")
    print(f"{'call':<32}{'direct tok/s':>14}{'ChatBrisk tok/s':>17}{'ratio':>8}")
    for name, direct, adapter in [
        ("invoke vs LLM.chat (one by one)", direct_chat, adapter_invoke),
        ("stream vs LLM.stream_chunks", direct_stream, adapter_stream),
        ("batch(8) vs LLM.generate([8])", direct_batch, adapter_batch),
    ]:
        direct_rate, adapter_rate = rates(direct, adapter, args.repeats)
        print(
            f"{name:<32}{direct_rate:>14.1f}{adapter_rate:>17.1f}{adapter_rate / direct_rate:>8.2f}"
        )
    llm.close()
    scratch.cleanup()


if __name__ == "__main__":
    main()
