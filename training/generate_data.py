"""Generate brisk's synthetic training and held-out evaluation data, offline, with a fixed seed.

Every sample is written by the templates below (no third-party text). Output: JSON lines, one
sample per line, either ``{"kind": "prose", "text": ...}`` or
``{"kind": <task>, "messages": [...], "tools": [...] | null}``; evaluation samples also carry the
expected answer. The eval split draws function words, argument names, people and places only
from the held-out pools in ``training/pools.py``.

    python -m training.generate_data --out training/out/data --seed 1234 \
        --num-train 150000 --num-easy 60000 --num-eval 200 --request-order

(the canonical first set: ``make_first_set`` in training/steps.sh; the defaults make a smaller one
without the easy set).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training import pools

DEFAULT_SYSTEMS = [
    "You are a helpful assistant.",
    "You are Brisk, a small and helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "You are a friendly assistant.",
    "Answer the user's questions.",
]
TOOL_SYSTEMS = [
    "You are a helpful assistant with access to tools.",
    "You are a helpful assistant. Use the tools when they help.",
    "You are an assistant that can call functions.",
]


def dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


# Made-up words: nonsense that no pool holds, so a model can only get them right by copying.
ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "cr",
    "dr",
    "fl",
    "gr",
    "kl",
    "pr",
    "st",
    "tr",
    "sh",
    "ch",
    "th",
    "sk",
    "pl",
]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ou", "ie", "y"]
CODAS = ["", "", "", "", "n", "r", "l", "s", "m", "t", "k", "nd", "rt", "st", "x", "ng"]
ACCENTS = {"a": "áàäâ", "e": "éèë", "i": "íï", "o": "öóô", "u": "üú", "n": "ñ", "c": "ç", "s": "ş"}
CJK = "山川田中木林森花月日星海空雲雨雪風光明水火土金石竹松梅桜春夏秋冬東西南北"
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
# Letters of the made-up words of --other-scripts: two UTF-8 bytes each, which the byte-level
# tokenizer splits into tokens alternating lead and continuation bytes (a held-out Cyrillic place
# of 11 letters is 16 tokens, while the training places' two Cyrillic names are one token each).
OTHER_SCRIPTS = ("абвгдежзийклмнопрстуфхцчшщыэюяё", "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώ")
# Names of --native-names: made-up names in Chinese or Japanese characters (any CJK ideograph, or
# kana syllables, sometimes with a company suffix), glossed in English words in brackets, as
# LangChain's standard tests ask ("Create a customer named '你好啊集团' (Hello Group) - a Chinese
# technology company").
HIRAGANA = (
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわん"
)
KATAKANA = (
    "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワン"
)
NATIVE_SUFFIXES = ("集团", "公司", "有限公司", "株式会社", "商店", "工房", "書店", "科技")
GLOSS_WORDS = (
    "Hello Sun Moon River Mountain Star Bright Golden Green Blue Red East West North South New Old "
    "Happy Lucky Peace Harmony Dragon Tiger Crane Pine Bamboo Flower Spring Autumn Ocean Sky Light"
).split()
GLOSS_KINDS = "Group Corporation Company Trading Studio Works Books Shop Bakery Tech Labs".split()
# Free-text arguments (``--free-text-args``): a phrase the request states in prose, copied whole.
# By default a fifth of the tools with fewer than four arguments get one (``--free-text-share``).
FREE_TEXT_SHARE = 0.2
FREE_TEXT_ARG_NAMES = [
    "description",
    "notes",
    "note",
    "comment",
    "summary",
    "message",
    "reason",
    "details",
    "remarks",
    "about",
    "bio",
    "caption",
    "memo",
    "instructions",
]
FREE_TEXT_ADJECTIVES = [
    "small",
    "large",
    "new",
    "local",
    "family",
    "friendly",
    "busy",
    "quiet",
    "old",
    "young",
    "online",
    "Chinese",
    "Japanese",
    "German",
    "French",
    "Spanish",
    "Indian",
    "Brazilian",
    "Korean",
    "Italian",
]
FREE_TEXT_FIELDS = [
    "technology",
    "software",
    "food",
    "travel",
    "music",
    "design",
    "shipping",
    "energy",
    "fashion",
    "games",
]
FREE_TEXT_NOUNS = [
    "company",
    "startup",
    "shop",
    "bakery",
    "team",
    "client",
    "store",
    "school",
    "restaurant",
    "customer",
    "supplier",
    "group",
    "studio",
    "club",
]
# Held-out words and syllables no made-up training word may contain or equal.
HELDOUT_WORDS = {
    w.lower()
    for w in pools.HELDOUT_FIRST_NAMES
    + pools.HELDOUT_LAST_NAMES
    + pools.HELDOUT_PLACES
    + pools.HELDOUT_ARG_NAMES
}
HELDOUT_WORDS |= {
    w for t in pools.HELDOUT_TOPICS + pools.HELDOUT_ARG_NAMES for w in re.split("[ _]", t)
}
HELDOUT_WORDS |= {v for v, _ in pools.HELDOUT_VERBS}
HELDOUT_WORDS |= {u for u, _ in pools.HELDOUT_UNITS}


# Verbs of tools that read something, whose one-argument requests ``--topic-questions`` may ask as
# a question about the topic ("What is the weather in Paris?" for get_weather(city)).
READING_VERBS = frozenset(
    {"get", "fetch", "find", "look up", "search", "check", "list", "track", "show", "query"}
    | {"estimate", "measure", "predict", "inspect", "locate", "forecast"}
)

# Questions about a tool's topic with its one value (``--topic-questions``); the first three are
# also among ``--more-phrasings``' one-value requests.
TOPIC_QUESTIONS = (
    "What is the {t} in {a}?",
    "What's the {t} for {a}?",
    "Tell me the {t} of {a}.",
    "How is the {t} in {a} today?",
    "Show me the {t} for {a}.",
    "I'd like to know the {t} in {a}.",
    "Any {t} for {a}?",
    "{T} in {a}?",
    "Give me the {t} for {a}, please.",
)

# The words of conversion requests and descriptions, which no made-up unit may be.
CONVERSION_WORDS = frozenset(
    "convert converts value values into from what how many much there that degrees please have".split()
)

# Gen.sample's mix: cumulative upper bounds of tools, extraction, JSON keys, chat and drills (prose
# takes the rest).
DEFAULT_TOOL_SHARE = 0.40
DEFAULT_MIX = (DEFAULT_TOOL_SHARE, 0.58, 0.67, 0.78, 0.86)

# How many tools a (not easy) tool sample offers: 1-5, weighted. ``--many-tools`` shifts the weight
# to 3-5 tools, where the choice of tool goes wrong most (the held-out sets keep the default).
TOOL_COUNT_WEIGHTS = (22, 26, 24, 16, 12)
MANY_TOOL_COUNT_WEIGHTS = (8, 16, 24, 26, 26)


def check_share(name: str, value: float) -> float:
    """``value`` if it is a share in [0, 1], else a ValueError naming ``name``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def mix_thresholds(tool_share: float) -> tuple[float, ...]:
    """DEFAULT_MIX with the tools' share set to ``tool_share`` and the other kinds scaled to the
    rest; the default share returns DEFAULT_MIX itself, so those draws never change."""
    check_share("tool_share", tool_share)
    if tool_share == DEFAULT_TOOL_SHARE:
        return DEFAULT_MIX
    scale = (1.0 - tool_share) / (1.0 - DEFAULT_TOOL_SHARE)
    return (tool_share,) + tuple(
        tool_share + (t - DEFAULT_TOOL_SHARE) * scale for t in DEFAULT_MIX[1:]
    )


class Pools:
    """The pools one split draws from."""

    def __init__(self, split: str) -> None:
        held = split == "eval"
        self.verbs = pools.VERBS + pools.HELDOUT_VERBS if held else pools.VERBS
        self.topics = pools.HELDOUT_TOPICS if held else pools.TOPICS
        self.syllables = pools.HELDOUT_SYLLABLES if held else pools.SYLLABLES
        self.arg_names = pools.HELDOUT_ARG_NAMES if held else pools.ARG_NAMES
        self.first = pools.HELDOUT_FIRST_NAMES if held else pools.FIRST_NAMES
        self.last = pools.HELDOUT_LAST_NAMES if held else pools.LAST_NAMES
        self.places = pools.HELDOUT_PLACES if held else pools.PLACES
        self.small_talk = pools.HELDOUT_SMALL_TALK if held else pools.SMALL_TALK
        # the small-talk groups that may open a request and those that may close one
        roles = pools.HELDOUT_TALK_ROLES if held else pools.TALK_ROLES
        self.talk_openers = [g for g, role in zip(self.small_talk, roles) if role == "opens"]
        self.talk_closers = [g for g, role in zip(self.small_talk, roles) if role == "closes"]
        # the quantities with two units or more, and their units (a conversion takes two)
        units: dict[str, list[str]] = {}
        for unit, quantity in pools.HELDOUT_UNITS if held else pools.UNITS:
            units.setdefault(quantity, []).append(unit)
        self.units = {q: u for q, u in units.items() if len(u) > 1}
        self.reading_verbs = [v for v in self.verbs if v[1] in READING_VERBS]
        self.held = held


def tool_spec(
    name: str,
    description: str,
    parameters: dict[str, Any],
    verb: str,
    topic: str,
    args: list[dict[str, Any]],
    required: list[str],
    **extra: Any,
) -> dict[str, Any]:
    """A generated tool: its OpenAI-style definition (``tool``) and what requests are made from."""
    function = {"name": name, "description": description, "parameters": parameters}
    return {
        "tool": {"type": "function", "function": function},
        "name": name,
        "verb": verb,
        "topic": topic,
        "args": args,
        "required": set(required),
        **extra,
    }


class Gen:
    """The sample writer of one split.

    ``more_phrasings`` adds the request styles of the second training set (``--more-phrasings``):
    call notation (``fn(3)``, ``fn(x=1)``), single-quoted values and keys, "Use the tool."
    suffixes, "a X named Y" requests with a trailing gloss, "City, ST" places, wider CJK strings,
    and JSON requests in other words ("Return the result as a JSON with 'a' and 'b' keys.").
    ``request_order`` writes a call's arguments in the order the request mentions them instead of
    the schema's order (``--request-order``); it draws no random numbers, so the samples are the
    same but for that order.
    ``free_text_args`` gives some tools a free-text argument (``description``, ``notes``, ...)
    whose value the request states as a phrase, often without naming it ("Create a customer named
    X - a small bakery"); the call copies the phrase whole (``--free-text-args``).
    Off, the generator draws exactly what it always drew (the first set stays byte-identical).
    ``tool_share`` is the share of samples that offer tools (``--tool-share``, default 0.40); the
    other kinds keep their proportions among the rest. At the default the draws are the ones the
    generator always made.
    ``many_tools`` offers 3-5 tools more often (``--many-tools``, MANY_TOOL_COUNT_WEIGHTS); off,
    the draws are the ones the generator always made.
    ``open_verbs`` is the share of training tools whose verb comes from an open set instead of
    ``pools.VERBS`` (``--open-verbs``): half of them an English verb of ``pools.EXTRA_VERBS``, half a
    made-up word, so that the verb of a function name is copied from the request, not recalled from
    50. At 0 (the default) no extra random numbers are drawn; the held-out split ignores it.
    ``other_scripts`` is the share of training string values written as one or two made-up words in
    Cyrillic or Greek letters (``--other-scripts``), so that copying such bytes is practised. At 0
    (the default) no extra random numbers are drawn; the held-out split ignores it.
    ``docstrings`` is the share of tools whose description is written as a Python docstring, as
    LangChain's ``@tool`` passes a function's docstring on: a sentence, often naming an argument,
    then mostly ``Args:`` (each argument's name and a line about it) and ``Returns:`` sections
    (``--docstrings``). ``conversions`` is the share of tools that are unit conversions
    (``celsius_to_fahrenheit(celsius)``, asked for as "Convert 30 degrees Celsius to Fahrenheit.",
    often beside the conversion back; ``--conversions``), and ``questions`` the share of
    one-argument requests of a tool that reads something ("get", "check", ...) asked as a question
    about its topic ("What is the weather in Paris?"; ``--topic-questions``); ``readers`` the share
    of tools made with a reading verb and one argument, so that more requests can be such questions
    (``--reader-tools``). ``conversion_distractors`` is the share of tool samples whose tools
    gain a unit conversion that the request does not ask for, the first call going to another tool
    (``--conversion-distractors``), so that a conversion offered is not a conversion asked for;
    ``native_names`` the share of tool samples whose first call creates a record "named 'NAME'
    (Gloss) - a phrase", NAME in Chinese or Japanese characters (``--native-names``). At 0 (the
    defaults) none of the six draws a random number.
    ``small_talk`` is the share of tool samples in which the user makes small talk instead of a
    request (a greeting, thanks, "How are you?", ...; ``pools.SMALL_TALK``, held out:
    ``pools.HELDOUT_SMALL_TALK``) and the assistant answers in text, calling no tool
    (``--small-talk``), beside the 8% of tool samples where no tool fits a simple question. At 0
    (the default) it draws no random number. ``chatty_requests`` is the share of tool samples with
    calls whose request comes with small talk around it ("Hi there! What is the weather in
    Paris?", "Schedule the meteor shower. Thanks!"; ``--chatty-requests``): the assistant still
    calls the tool, so that what decides between a call and a text answer is whether the user asks
    for something a tool does, not the greeting or the thanks. At 0 it draws no random number.
    ``place_readers`` is the share of reading tools whose one argument is a place (``city``,
    ``location``, ...; ``pools.PLACE_ARG_NAMES``) with a place as its value, half the time a
    capital, so that questions such as "What is the weather in Paris?" call a tool as often as
    "What is the capital of France?" is answered in text (``--place-readers``; training split
    only). At 0 it draws no random number.
    """

    def __init__(
        self,
        seed: int,
        split: str,
        more_phrasings: bool = False,
        request_order: bool = False,
        free_text_args: bool = False,
        tool_share: float = DEFAULT_TOOL_SHARE,
        many_tools: bool = False,
        open_verbs: float = 0.0,
        other_scripts: float = 0.0,
        free_text_share: float = FREE_TEXT_SHARE,
        docstrings: float = 0.0,
        conversions: float = 0.0,
        questions: float = 0.0,
        readers: float = 0.0,
        conversion_distractors: float = 0.0,
        native_names: float = 0.0,
        small_talk: float = 0.0,
        chatty_requests: float = 0.0,
        place_readers: float = 0.0,
    ) -> None:
        self.r = random.Random(seed)
        shares = {
            "open_verbs": open_verbs,
            "other_scripts": other_scripts,
            "free_text_share": free_text_share,
            "docstrings": docstrings,
            "conversions": conversions,
            "questions": questions,
            "readers": readers,
            "conversion_distractors": conversion_distractors,
            "native_names": native_names,
            "small_talk": small_talk,
            "chatty_requests": chatty_requests,
            "place_readers": place_readers,
        }
        for name, share in shares.items():
            check_share(name, share)
        self.docstrings = docstrings
        self.conversions = conversions
        self.questions = questions
        self.readers = readers
        self.conversion_distractors = conversion_distractors
        self.native_names = native_names
        self.small_talk = small_talk
        self.chatty_requests = chatty_requests
        self.open_verbs = 0.0 if split == "eval" else open_verbs
        self.other_scripts = 0.0 if split == "eval" else other_scripts
        self.place_readers = 0.0 if split == "eval" else place_readers
        self.tool_count_weights = MANY_TOOL_COUNT_WEIGHTS if many_tools else TOOL_COUNT_WEIGHTS
        self.thresholds = mix_thresholds(tool_share)
        self.p = Pools(split)
        self.more = more_phrasings
        self.request_order = request_order
        self.free_text = free_text_args
        self.free_text_share = free_text_share

    # ---------------------------------------------------------------- small values
    def pseudo_word(self) -> str:
        r = self.r
        n = r.choice([2, 2, 3])
        sy = [r.choice(self.p.syllables)]
        # Held-out pseudo-words always contain a held-out syllable; training ones never do.
        sy += [
            r.choice(pools.SYLLABLES if not self.p.held else self.p.syllables + pools.SYLLABLES)
            for _ in range(n - 1)
        ]
        r.shuffle(sy)
        return "".join(sy)

    def made_up_word(self) -> str:
        """A pronounceable random word (training: never containing a held-out syllable or word)."""
        r = self.r
        while True:
            w = "".join(
                r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS)
                for _ in range(r.choice([1, 2, 2, 2, 3, 3]))
            )
            if len(w) < 3:
                continue
            if self.p.held or (
                w not in HELDOUT_WORDS and not any(sy in w for sy in pools.HELDOUT_SYLLABLES)
            ):
                return w

    def accented(self, w: str) -> str:
        r = self.r
        return "".join(r.choice(ACCENTS[c]) if c in ACCENTS and r.random() < 0.3 else c for c in w)

    def made_up_name(self) -> str:
        r = self.r
        first = self.made_up_word().capitalize() if r.random() < 0.6 else r.choice(self.p.first)
        last = self.made_up_word().capitalize() if r.random() < 0.6 else r.choice(self.p.last)
        if r.random() < 0.15:
            first = self.accented(first)
        return f"{first} {last}"

    def code(self) -> str:
        r = self.r
        k = r.random()
        letters = "".join(r.choice(CODE_LETTERS) for _ in range(r.randint(1, 4)))
        digits = "".join(r.choice("0123456789") for _ in range(r.randint(2, 6)))
        if k < 0.4:
            return f"{letters}-{digits}"
        if k < 0.6:
            return letters + digits
        if k < 0.8:
            return "".join(
                r.choice("abcdefghkmnprstuvwxz0123456789") for _ in range(r.randint(4, 8))
            )
        return f"{r.randint(1990, 2035)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"

    def person(self) -> str:
        if self.r.random() < 0.35:
            return self.made_up_name()
        return f"{self.r.choice(self.p.first)} {self.r.choice(self.p.last)}"

    def place(self) -> str:
        return self.r.choice(self.p.places)

    def integer(self) -> int:
        r = self.r
        lo, hi = r.choice([(0, 10), (0, 100), (-50, 50), (100, 9999), (-1000, 1000), (1, 500000)])
        return r.randint(lo, hi)

    def number(self) -> float:
        r = self.r
        while True:
            scale = r.choice([1, 10, 100, 1000])
            v = round(r.uniform(-scale if r.random() < 0.3 else 0, scale), r.choice([1, 2, 2, 3]))
            if v != int(v):
                return v

    def other_script_words(self) -> str:
        r = self.r
        letters = r.choice(OTHER_SCRIPTS)
        words = (
            "".join(r.choice(letters) for _ in range(r.randint(4, 11))).capitalize()
            for _ in range(r.choice([1, 1, 2]))
        )
        return " ".join(words)

    def string_value(self) -> str:
        r = self.r
        if self.other_scripts and r.random() < self.other_scripts:
            return self.other_script_words()
        if self.more and r.random() < 0.1:
            if r.random() < 0.5:
                return f"{self.place()}, {''.join(r.choice(CODE_LETTERS) for _ in range(2))}"
            # any CJK ideograph, not only the common few: copying must not depend on the token
            return "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(r.randint(2, 6)))
        k = r.random()
        if k < 0.18:
            return self.place()
        if k < 0.36:
            return self.person()
        if k < 0.48:
            return r.choice(pools.WORDS)
        if k < 0.58:
            return self.pseudo_word()
        if k < 0.70:
            return " ".join(self.made_up_word() for _ in range(r.choice([1, 1, 2, 3])))
        if k < 0.84:
            return self.code()
        if k < 0.90:
            return f"{self.made_up_word()}@{r.choice(['example.com', 'mail.test'])}"
        if k < 0.95:
            return self.accented(self.made_up_word().capitalize())
        return "".join(r.choice(CJK) for _ in range(r.randint(1, 3)))

    # ---------------------------------------------------------------- tools
    def topic(self, avoid: set[str]) -> str:
        r = self.r
        for _ in range(100):
            k = r.random()
            if k < (0.8 if self.p.held else 0.5):
                t = r.choice(self.p.topics)
            elif k < (0.9 if self.p.held else 0.65):
                t = f"{self.pseudo_word()} {r.choice(['record', 'item', 'entry', 'list', 'status', 'value', 'data', 'report'])}"
            elif self.p.held or k < 0.75:
                t = self.pseudo_word()
            else:
                t = " ".join(self.made_up_word() for _ in range(r.choice([1, 2, 2])))
            if t not in avoid:
                return t
        raise RuntimeError("topic pool exhausted")

    def func_name(self, verb: str, topic: str) -> str:
        r = self.r
        words = [verb] + topic.split()
        style = r.random()
        if style < 0.7:
            name = "_".join(words)
        elif style < 0.9:
            name = words[0] + "".join(w.capitalize() for w in words[1:])
        else:
            name = "_".join(words[1:]) + "_" + verb
        if r.random() < 0.08:
            name = r.choice(["api_", "my_", "do_", "tool_"]) + name
        return name

    def arg_name(self, avoid: set[str]) -> str:
        r = self.r
        suffixes = ["id", "name", "count", "level", "code", "mode"]
        for _ in range(100):
            k = r.random()
            if k < (0.75 if self.p.held else 0.45):
                a = r.choice(self.p.arg_names)
            elif self.p.held:
                a = (
                    self.pseudo_word()
                    if r.random() < 0.6
                    else f"{self.pseudo_word()}_{r.choice(suffixes)}"
                )
            elif k < 0.6:
                a = (
                    self.pseudo_word()
                    if r.random() < 0.5
                    else f"{self.pseudo_word()}_{r.choice(suffixes)}"
                )
            elif k < 0.75:
                a = self.made_up_word()
            elif k < 0.9:
                a = f"{self.made_up_word()}_{r.choice(suffixes + [self.made_up_word()])}"
            else:
                a = f"{r.choice(pools.ARG_NAMES)}_{self.made_up_word()}"
            if a not in avoid:
                return a
        raise RuntimeError("argument pool exhausted")

    def make_tool(self, avoid_topics: set[str], max_args: int = 4) -> dict[str, Any]:
        r = self.r
        if self.conversions and max_args >= 1 and r.random() < self.conversions:
            conversion = self.conversion_tool(avoid_topics)
            if conversion is not None:
                return conversion
        reader = bool(self.readers) and max_args >= 1 and r.random() < self.readers
        if reader:
            verb, verb_phrase = r.choice(self.p.reading_verbs)
        elif self.open_verbs and r.random() < self.open_verbs:
            verb = r.choice(pools.EXTRA_VERBS) if r.random() < 0.5 else self.made_up_word()
            verb_phrase = verb
        else:
            verb, verb_phrase = r.choice(self.p.verbs)
        topic = self.topic(avoid_topics)
        name = self.func_name(verb, topic)
        nargs = (
            1
            if reader
            else r.choices(
                [0, 1, 2, 3, 4][: max_args + 1], weights=[12, 30, 30, 18, 10][: max_args + 1]
            )[0]
        )
        props: dict[str, Any] = {}
        args: list[dict[str, Any]] = []
        used: set[str] = set()
        for _ in range(nargs):
            place = reader and self.place_readers > 0 and r.random() < self.place_readers
            an = r.choice(pools.PLACE_ARG_NAMES) if place else self.arg_name(used)
            used.add(an)
            if place:
                typ = "string"
            else:
                kinds = ["string", "integer", "number", "boolean", "enum"]
                typ = r.choices(kinds, weights=[40, 22, 20, 8, 10])[0]
            spec: dict[str, Any]
            if typ == "enum":
                opts = r.sample(
                    pools.WORDS[:40] + [self.pseudo_word() for _ in range(3)], r.randint(2, 4)
                )
                spec = {"type": "string", "enum": opts}
            else:
                spec = {"type": typ}
            if self.more and typ in ("integer", "number") and r.random() < 0.3:
                # bounds in the schema, as pydantic's Field(gt=..., le=...) writes them: numbers
                # the model must not copy into the call
                hi = r.choice([100, 1000, 10000, 1000000])
                lo = r.choice([0, 1, -hi])
                spec.update(
                    {"exclusiveMinimum": lo - 1, "exclusiveMaximum": hi + 1}
                    if r.random() < 0.5
                    else {"minimum": lo, "maximum": hi}
                )
            if r.random() < 0.25:
                spec["description"] = f"The {an.replace('_', ' ')}."
            props[an] = spec
            arg = {"name": an, "type": typ, "spec": spec}
            if place:
                arg["place"] = True
            args.append(arg)
        if self.free_text and nargs < 4 and r.random() < self.free_text_share:
            self.add_free_text_arg(topic, used, props, args)
        required = [a["name"] for a in args if r.random() < 0.8]
        params = {"type": "object", "properties": props, "required": required}
        desc = f"{verb_phrase.capitalize()} the {topic}."
        if r.random() < 0.2:
            desc = desc[:-1] + r.choice(
                [" for the user.", " by its details.", " quickly.", " now."]
            )
        if self.docstrings and r.random() < self.docstrings:
            desc = self.docstring(verb_phrase, topic, args)
        return tool_spec(name, desc, params, verb_phrase, topic, args, required)

    def docstring(self, verb: str, topic: str, args: list[dict[str, Any]]) -> str:
        """A tool description written as a docstring (``--docstrings``): "Get the current
        weather in a city." or a longer one with ``Args:`` and ``Returns:`` sections."""
        r = self.r
        clause = ""
        if args and r.random() < 0.6:
            words = r.choice(args)["name"].replace("_", " ")
            clause = r.choice([f" for a given {words}", f" in a {words}", f" by its {words}"])
        opening = r.choice(
            [
                "{V} the {t}{c}.",
                "{V} the current {t}{c}.",
                "Tool to {v} the {t}{c}.",
                "Use this tool to {v} the {t}{c}.",
            ]
        ).format(V=verb.capitalize(), v=verb, t=topic, c=clause)
        if r.random() < 0.3:
            opening += r.choice(
                [
                    f" Use it when the user asks about the {topic}.",
                    " Returns the result as text.",
                    f" Works for any {topic}.",
                ]
            )
        indent = "    " if r.random() < 0.7 else ""  # as written in the source, or cleaned
        text = opening
        if args and r.random() < 0.7:
            lines = []
            for a in args:
                words = a["name"].replace("_", " ")
                about = a["spec"].get("description") or r.choice(
                    [f"The {words}.", f"The {words} to use.", f"The {words} of the {topic}."]
                )
                lines.append(f"{indent}    {a['name']}: {about}")
            text += f"\n\n{indent}Args:\n" + "\n".join(lines)
        if r.random() < 0.5:
            returns = r.choice(
                ["A confirmation message.", f"The {topic} as a string.", "A dict with the result."]
            )
            text += f"\n\n{indent}Returns:\n{indent}    {returns}"
        return text

    def conversion_tool(self, avoid_topics: set[str]) -> dict[str, Any] | None:
        """A tool converting a number between two units of one quantity (``--conversions``), or
        None where its topic is taken."""
        r = self.r
        if not self.p.held and r.random() < 0.3:
            # made-up units, so that the units are copied, not recalled
            src, dst = self.made_up_unit(), self.made_up_unit()
            quantity = "amount"
        else:
            quantity = r.choice(list(self.p.units))
            src, dst = r.sample(self.p.units[quantity], 2)
        return self.conversion_spec(src, dst, quantity, avoid_topics)

    def made_up_unit(self) -> str:
        """A made-up word of four letters or more that none of the request's words can be."""
        while True:
            word = self.made_up_word()
            if len(word) >= 4 and word not in CONVERSION_WORDS:
                return word

    def conversion_spec(
        self, src: str, dst: str, quantity: str, avoid_topics: set[str]
    ) -> dict[str, Any] | None:
        r = self.r
        topic = f"{src} to {dst}"
        if src == dst or topic in avoid_topics:
            return None
        style = r.random()
        if style < 0.5:
            name = f"{src}_to_{dst}"
        elif style < 0.75:
            name = f"convert_{src}_to_{dst}"
        else:
            name = f"{src}To{dst.capitalize()}"
        an = src if r.random() < 0.5 else r.choice(["value", "amount", f"{src}_value", "x"])
        spec: dict[str, Any] = {"type": "number"}
        what = "a value" if quantity == "amount" else f"{article(quantity)} {quantity}"
        desc = r.choice(
            [
                f"Convert {what} from {src} to {dst}.",
                f"Convert {src} to {dst}.",
                f"Converts a value in {src} into {dst}.",
            ]
        )
        if self.docstrings and r.random() < self.docstrings:
            desc += f"\n\n    Args:\n        {an}: The {quantity} in {src}."
        params = {"type": "object", "properties": {an: spec}, "required": [an]}
        arg = {"name": an, "type": "number", "spec": spec}
        return tool_spec(
            name, desc, params, "convert", topic, [arg], [an], convert=(src, dst, quantity)
        )

    def conversion_request(self, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """ "Convert 30 degrees Celsius to Fahrenheit." and the call's one argument."""
        r = self.r
        src, dst, quantity = spec["convert"]
        value: float = r.randint(-40, 500) if r.random() < 0.6 else self.number()
        if r.random() < 0.3:
            src, dst = src.capitalize(), dst.capitalize()
        degrees = "degrees " if quantity == "temperature" and r.random() < 0.5 else ""
        text = r.choice(
            [
                "Convert {v} {d}{a} to {b}.",
                "What is {v} {d}{a} in {b}?",
                "How many {b} is {v} {a}?",
                "{v} {a} to {b}",
                "Please convert {v} {d}{a} into {b}.",
                "There are {v} {a}. How much is that in {b}?",
                "What's {v} {d}{a} in {b}?",
            ]
        ).format(v=value_str(value), d=degrees, a=src, b=dst)
        return text, {spec["args"][0]["name"]: value}

    def add_free_text_arg(
        self, topic: str, used: set[str], props: dict[str, Any], args: list[dict[str, Any]]
    ) -> None:
        """One free-text string argument, mostly last (as LangChain tools put ``description``)."""
        r = self.r
        an = r.choice([n for n in FREE_TEXT_ARG_NAMES if n not in used])
        used.add(an)
        spec: dict[str, Any] = {"type": "string"}
        if r.random() < 0.5:
            spec["description"] = r.choice(
                [f"Description of the {topic}.", f"A short note about the {topic}.", "Free text."]
            )
        at = len(args) if r.random() < 0.7 else r.randint(0, len(args))
        args.insert(at, {"name": an, "type": "string", "spec": spec, "free": True})
        # the schema lists properties in the same order as the arguments
        items = list(props.items())
        items.insert(at, (an, spec))
        props.clear()
        props.update(items)

    def free_text_value(self) -> str:
        """A phrase of 2-9 words: no commas or quotes, so where it ends is where the request ends."""
        r = self.r
        k = r.random()
        if k < 0.35:
            adjective = r.choice(FREE_TEXT_ADJECTIVES)
            words = ["an" if adjective[0] in "AEIOUaeiou" else "a", adjective]
            if r.random() < 0.6:
                words.append(r.choice(FREE_TEXT_FIELDS))
            words.append(r.choice(FREE_TEXT_NOUNS))
            if r.random() < 0.3:
                words += ["in", self.place()]
            return " ".join(words)
        if k < 0.55:
            return r.choice(
                [
                    f"{r.choice(pools.JOBS)} from {self.place()}",
                    f"likes the {r.choice(pools.COLORS)} {r.choice(pools.PRODUCTS)}",
                    f"call back after {r.randint(1, 11)} pm",
                    f"the {r.choice(pools.PRODUCTS)} arrived broken",
                    f"needs {r.randint(2, 40)} more boxes by Friday",
                    f"met at the {r.choice(pools.WORDS)} event",
                    f"order for {self.person()}",
                ]
            )
        n = r.randint(2, 6)
        words = [self.made_up_word() for _ in range(n)]
        if r.random() < 0.5:
            words.insert(r.randint(0, n), r.choice(["the", "a", "for", "with", "and", "of"]))
        return " ".join(words)

    def with_free_text(self, text: str, arg: dict[str, Any], value: str) -> str:
        """The request with a free-text argument's phrase added after it."""
        r = self.r
        p = arg["name"].replace("_", " ")
        base = text.rstrip(".?")
        return r.choice(
            [
                f"{base} - {value}",  # twice: LangChain's form, the most common
                f"{base} - {value}",
                f"{base}. {p.capitalize()}: {value}",
                f"{base}, {p}: {value}.",
                f'{base} with the {p} "{value}".',
                f"{base}. The {p} is: {value}.",
                f"{base}. Add the {p}: {value}",
            ]
        )

    def value_for(self, arg: dict[str, Any]) -> Any:
        if arg.get("free"):
            return self.free_text_value()
        if arg.get("place"):  # half of them capitals, the places "What is the capital of X?" names
            if self.r.random() < 0.5:
                return self.r.choice(pools.COUNTRIES_CAPITALS)[1]
            return self.place()
        typ = arg["type"]
        if typ == "string":
            return self.string_value()
        if typ in ("integer", "number"):
            spec = arg["spec"]
            lo = spec.get("minimum", spec.get("exclusiveMinimum", -math.inf - 1) + 1)
            hi = spec.get("maximum", spec.get("exclusiveMaximum", math.inf + 1) - 1)
            while True:
                v = self.integer() if typ == "integer" else self.number()
                if lo <= v <= hi:
                    return v
        if typ == "boolean":
            return self.r.random() < 0.5
        return self.r.choice(arg["spec"]["enum"])

    def value_text(self, v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return dumps(v)
        if self.more and "'" not in v and self.r.random() < 0.2:
            return f"'{v}'"
        if " " in v or self.r.random() < 0.3:
            return f'"{v}"'
        return v

    def call_notation(self, spec: dict[str, Any], arguments: dict[str, Any]) -> str:
        """``name(3)``, ``name(x=3, y="a")`` or ``name()``: the call written as code."""
        r = self.r

        def lit(v: Any) -> str:
            if isinstance(v, str):
                return f"'{v}'" if "'" not in v and r.random() < 0.4 else dumps(v)
            return value_str(v)

        if len(arguments) == 1 and r.random() < 0.6:
            inner = lit(next(iter(arguments.values())))
        else:
            inner = ", ".join(f"{k}={lit(v)}" for k, v in arguments.items())
        call = f"{spec['name']}({inner})"
        return r.choice(
            [
                "What is the value of {c}?",
                "What is {c}?",
                "Call {c}.",
                "Run {c}",
                "Compute {c}.",
                "{c}",
                "Please call {c} for me.",
                "I need the result of {c}.",
            ]
        ).format(c=call)

    def tool_hint(self, spec: dict[str, Any]) -> str:
        return self.r.choice(
            [
                " Use the tool.",
                " Use a tool.",
                f" Use the {spec['name']} tool.",
                " Call the function.",
                " Please use the tools.",
                " Use the tools if needed.",
            ]
        )

    def gloss(self) -> str:
        r = self.r
        words = " ".join(self.made_up_word() for _ in range(r.randint(1, 2)))
        return r.choice(
            [f" ({words.capitalize()})", f" - a {r.choice(pools.WORDS)} {words}", f", the {words}"]
        )

    def request_for(self, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A user request that asks for one call of this tool, and the call's arguments."""
        if spec.get("named_record"):  # --native-names: always in LangChain's form
            return self.named_record_request(spec)
        text, arguments = self.plain_request_for(spec)
        if self.more and self.r.random() < 0.15:
            if self.free_text and text[-1] not in ".?!":
                text += "."  # a free-text phrase may end the request: the hint must not extend it
            text += self.tool_hint(spec)
        return text, arguments

    def plain_request_for(self, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        r = self.r
        chosen = [a for a in spec["args"] if a["name"] in spec["required"] or r.random() < 0.5]
        arguments = {a["name"]: self.value_for(a) for a in chosen}
        if self.more and r.random() < 0.15:
            return self.call_notation(spec, arguments), arguments
        if "convert" in spec:
            return self.conversion_request(spec)
        free = next((a for a in chosen if a.get("free")), None)
        if free is not None and r.random() < 0.65:
            return self.free_text_request(spec, chosen, arguments, free)
        return self.request_text(spec, chosen, arguments)

    def free_text_request(
        self,
        spec: dict[str, Any],
        chosen: list[dict[str, Any]],
        arguments: dict[str, Any],
        free: dict[str, Any],
    ) -> tuple[str, dict[str, Any]]:
        """A request that states the free-text argument last, as a phrase after the rest."""
        r = self.r
        value = arguments[free["name"]]
        rest = [a for a in chosen if a is not free]
        if len(rest) == 1 and rest[0]["type"] == "string" and r.random() < 0.5:
            # "Create a customer named 'X' (Hello Group) - a Chinese technology company"
            a = rest[0]
            words = " ".join(self.made_up_word() for _ in range(r.randint(1, 2)))
            gloss = f" ({words.capitalize()})" if r.random() < 0.5 else ""
            named = self.value_text(arguments[a["name"]])
            text = f"{spec['verb'].capitalize()} a {spec['topic']} named {named}{gloss} - {value}"
            if self.request_order:
                arguments = {a["name"]: arguments[a["name"]], free["name"]: value}
        else:
            rest_args = {a["name"]: arguments[a["name"]] for a in rest}
            text, rest_args = self.request_text(spec, rest, rest_args)
            text = self.with_free_text(text, free, value)
            if self.request_order:
                arguments = {**rest_args, free["name"]: value}
        return text, arguments

    def request_text(
        self, spec: dict[str, Any], chosen: list[dict[str, Any]], arguments: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The request for these arguments (``arguments`` reordered under ``request_order``)."""
        r = self.r
        mention = list(chosen)
        if r.random() < 0.3:
            r.shuffle(mention)
        if self.request_order:
            arguments = {a["name"]: arguments[a["name"]] for a in mention}
        parts = []
        for a in mention:
            phrase = a["name"].replace("_", " ") if r.random() < 0.6 else a["name"]
            parts.append((phrase, self.value_text(arguments[a["name"]])))
        verb, topic = spec["verb"], spec["topic"]
        if not parts:
            templates = [
                "{V} the {t}.",
                "Please {v} the {t}.",
                "Can you {v} the {t}?",
                "I want to {v} the {t}.",
                "{v} {t}",
                "Could you {v} the {t} for me?",
                "{v} the {t} please",
            ]
            text = r.choice(templates)
            return text.format(V=verb.capitalize(), v=verb, t=topic), arguments
        # "a X named Y - gloss" leaves the gloss out of the call: not for tools that take free text
        has_free = any(a.get("free") for a in spec["args"])
        if (
            self.questions
            and len(parts) == 1
            and not has_free
            and verb in READING_VERBS
            and r.random() < self.questions
        ):
            text = r.choice(TOPIC_QUESTIONS)
            return text.format(T=topic.capitalize(), t=topic, a=parts[0][1]), arguments
        if self.more and len(parts) == 1 and not has_free and r.random() < 0.15:
            v = parts[0][1]
            text = r.choice(
                [
                    "{V} a {t} named {a}{g}",
                    "{V} the {t} called {a}{g}.",
                    *TOPIC_QUESTIONS[:3],
                ]
            )
            return text.format(V=verb.capitalize(), t=topic, a=v, g=self.gloss()), arguments
        if len(parts) == 1 and r.random() < 0.15:  # the value alone: one argument, nothing to name
            v = parts[0][1]
            text = r.choice(
                [
                    "{V} the {t} for {a}.",
                    "{V} the {t}: {a}",
                    "Please {v} the {t} for {a}.",
                    "{v} {t} {a}",
                ]
            )
            return text.format(V=verb.capitalize(), v=verb, t=topic, a=v), arguments
        style = r.randrange(6)
        if style == 0:
            argtext = "with " + join_and([f"{p} {v}" for p, v in parts])
        elif style == 1:
            argtext = ", ".join(f"{p}: {v}" for p, v in parts)
        elif style == 2:
            argtext = ", ".join(f"{p} = {v}" for p, v in parts)
        elif style == 3:
            argtext = "where " + join_and([f"the {p} is {v}" for p, v in parts])
        elif style == 4:
            argtext = "(" + ", ".join(f"{p} {v}" for p, v in parts) + ")"
        else:
            argtext = "for " + join_and([f"{p} {v}" for p, v in parts])
        templates = [
            "{V} the {t} {a}.",
            "Please {v} the {t} {a}.",
            "Can you {v} the {t} {a}?",
            "I want to {v} the {t} {a}.",
            "{v} {t} {a}",
            "Could you {v} the {t} {a}?",
            "I need you to {v} the {t}. {A}.",
        ]
        tmpl = r.choice(templates)
        a_sentence = join_and([f"the {p} is {v}" for p, v in parts])
        a_sentence = a_sentence[0].upper() + a_sentence[1:]
        return tmpl.format(V=verb.capitalize(), v=verb, t=topic, a=argtext, A=a_sentence), arguments

    def toolset(self, n: int, max_args: int = 4) -> list[dict[str, Any]]:
        specs: list[dict[str, Any]] = []
        topics: set[str] = set()
        names: set[str] = set()
        while len(specs) < n:
            s = self.make_tool(topics, max_args)
            if s["name"] in names:
                continue
            topics.add(s["topic"])
            names.add(s["name"])
            specs.append(s)
            if "convert" in s and len(specs) < n and self.r.random() < 0.5:
                # the conversion back beside it: the request's order of units picks the tool
                src, dst, quantity = s["convert"]
                back = self.conversion_spec(dst, src, quantity, topics)
                if back is not None and back["name"] not in names:
                    topics.add(back["topic"])
                    names.add(back["name"])
                    specs.append(back)
        return specs

    def tool_result(self) -> dict[str, Any]:
        r = self.r
        keys: set[str] = set()
        out: dict[str, Any] = {}
        for _ in range(r.choice([1, 1, 2, 2, 3])):
            k = r.choice(
                [
                    "status",
                    "result",
                    "value",
                    "total",
                    "temperature",
                    "price",
                    "count",
                    "message",
                    "id",
                    "time",
                    "date",
                    "name",
                    "city",
                    "score",
                    "level",
                    "eta",
                    "balance",
                    "rate",
                    "distance",
                    "summary",
                ]
                + [self.arg_name(set()) for _ in range(2)]
            )
            if k in keys:
                continue
            keys.add(k)
            out[k] = r.choice([self.string_value, self.integer, self.number])()
        return out

    def answer_from_result(self, spec: dict[str, Any], result: dict[str, Any]) -> str:
        r = self.r
        items = [
            (k.replace("_", " "), v if isinstance(v, str) else dumps(v)) for k, v in result.items()
        ]
        if len(items) == 1 and r.random() < 0.5:
            k, v = items[0]
            return r.choice(
                [f"The {k} is {v}.", f"Done. The {k} is {v}.", f"The {spec['topic']} {k} is {v}."]
            )
        facts = join_and([f"{k} is {v}" for k, v in items])
        return r.choice(
            [
                f"Here is the {spec['topic']}: {facts}.",
                f"The {spec['topic']} result: {facts}.",
                f"I checked the {spec['topic']}. The {facts}.",
                f"Done: {facts}.",
            ]
        )

    def first_call_tool(self, specs: list[dict[str, Any]], easy: bool) -> dict[str, Any] | None:
        """The tool the first call must go to, where --native-names or --conversion-distractors
        added one to ``specs`` (in place); None: the usual draw."""
        r = self.r
        if easy:
            return None
        if self.native_names and r.random() < self.native_names:
            named = self.named_record_tool({s["topic"] for s in specs})
            self.add_tool(specs, named)
            return named
        if (
            self.conversion_distractors
            and not any("convert" in s for s in specs)
            and r.random() < self.conversion_distractors
        ):
            target = r.choice(specs)
            conversion = self.conversion_tool({s["topic"] for s in specs})
            if conversion is not None and conversion["name"] not in {s["name"] for s in specs}:
                self.add_tool(specs, conversion, keep=target)
            return target
        return None

    def add_tool(
        self, specs: list[dict[str, Any]], spec: dict[str, Any], keep: dict[str, Any] | None = None
    ) -> None:
        """``spec`` among ``specs`` at a random place; with five already, in place of one (never
        ``keep``)."""
        r = self.r
        if len(specs) >= 5:
            specs.remove(r.choice([s for s in specs if s is not keep]))
        specs.insert(r.randint(0, len(specs)), spec)

    def named_record_tool(self, avoid_topics: set[str]) -> dict[str, Any]:
        """A tool that creates a record from a name and a free-text argument (--native-names)."""
        r = self.r
        verb, verb_phrase = r.choice(self.p.verbs)
        topic = self.topic(avoid_topics)
        name_arg = r.choice([f"{topic.split()[-1]}_name", "name", "title", self.arg_name(set())])
        name_spec: dict[str, Any] = {"type": "string"}
        props: dict[str, Any] = {name_arg: name_spec}
        args = [{"name": name_arg, "type": "string", "spec": name_spec}]
        self.add_free_text_arg(topic, {name_arg}, props, args)
        desc = f"{verb_phrase.capitalize()} a {topic} with a name and a description."
        if self.docstrings and r.random() < self.docstrings:
            desc = self.docstring(verb_phrase, topic, args)
        required = [a["name"] for a in args]
        params = {"type": "object", "properties": props, "required": required}
        name = self.func_name(verb, topic)
        return tool_spec(name, desc, params, verb_phrase, topic, args, required, named_record=True)

    def native_name(self) -> str:
        """A made-up name in Chinese characters or Japanese kana, sometimes with a suffix."""
        r = self.r
        k = r.random()
        if k < 0.5:
            name = "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(r.randint(2, 5)))
        else:
            kana = HIRAGANA if k < 0.75 else KATAKANA
            name = "".join(r.choice(kana) for _ in range(r.randint(3, 6)))
        if r.random() < 0.5:
            name += r.choice(NATIVE_SUFFIXES)
        return name

    def named_record_request(self, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """ "Create a customer named '你好啊集团' (Hello Group) - a Chinese technology company"."""
        r = self.r
        name_arg = next(a for a in spec["args"] if not a.get("free"))
        free = next(a for a in spec["args"] if a.get("free"))
        name = self.native_name() if r.random() < 0.8 else self.string_value()
        value = self.free_text_value()
        gloss = ""
        if r.random() < 0.7:
            words = r.sample(GLOSS_WORDS, r.choice([1, 1, 2]))
            gloss = f" ({' '.join(words + [r.choice(GLOSS_KINDS)])})"
        quoted = r.choice([f"'{name}'", f"'{name}'", f'"{name}"', name])
        verb = spec["verb"]
        text = r.choice(
            [
                f"{verb.capitalize()} a {spec['topic']} named {quoted}{gloss} - {value}",
                f"{verb.capitalize()} a {spec['topic']} named {quoted}{gloss} - {value}",
                f"Please {verb} a {spec['topic']} called {quoted}{gloss} - {value}",
                f"{verb.capitalize()} the {spec['topic']} {quoted}{gloss} - {value}",
            ]
        )
        arguments = {name_arg["name"]: name, free["name"]: value}  # the request's order
        if not self.request_order:
            arguments = {a["name"]: arguments[a["name"]] for a in spec["args"]}
        return text, arguments

    def tool_sample(self, easy: bool = False) -> dict[str, Any]:
        """Tools offered, a request, the calls; ``easy``: 1-2 tools of at most 2 arguments, one call."""
        r = self.r
        if easy:
            n_tools = r.choice([1, 1, 2])
            specs = self.toolset(n_tools, max_args=2)
        else:
            n_tools = r.choices([1, 2, 3, 4, 5], weights=self.tool_count_weights)[0]
            specs = self.toolset(n_tools)
        first = self.first_call_tool(specs, easy)
        tools = [s["tool"] for s in specs]
        if r.random() < 0.3:
            r.shuffle(tools)
        kind_roll = r.random()
        messages: list[dict[str, Any]] = []
        if r.random() < 0.6:
            messages.append({"role": "system", "content": r.choice(TOOL_SYSTEMS)})
        # No tool fits (a simple question, or with --small-talk small talk): answer in text.
        talk = kind_roll >= 0.08 and self.small_talk > 0 and r.random() < self.small_talk
        if kind_roll < 0.08 or talk:
            q, a = self.small_talk_turn() if talk else self.simple_qa()
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            sample = {"kind": "tool_none", "messages": messages, "tools": tools}
            return {**sample, "small_talk": True} if talk else sample
        n_calls = 1 if easy or r.random() < 0.82 else 2
        calls = []
        texts = []
        for i in range(n_calls):
            if i == 0 and first is not None:
                spec = first
            else:
                spec = r.choice(specs) if i == 0 or r.random() < 0.6 else calls[0][0]
            text, arguments = self.request_for(spec)
            calls.append((spec, arguments))
            texts.append(text)
        if n_calls == 1:
            user = texts[0]
        else:
            second = texts[1][0].lower() + texts[1][1:]
            joins = [", and also ", ". Then ", ". Also, ", " and "]
            first_spec, first_args = calls[0]
            if any(a.get("free") and a["name"] in first_args for a in first_spec["args"]):
                joins.pop()  # a free-text phrase may end the first request: " and" would extend it
            user = texts[0].rstrip(".?") + r.choice(joins) + second
        chatty = self.chatty_requests > 0 and r.random() < self.chatty_requests
        if chatty:
            user = self.with_small_talk(user)
        messages.append({"role": "user", "content": user})
        tool_calls = [
            {"type": "function", "function": {"name": s["name"], "arguments": a}} for s, a in calls
        ]
        messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        expected = [{"name": s["name"], "arguments": a} for s, a in calls]
        # Which calls' arguments are free text ([[call 0's], [call 1's]]), where any are.
        free = [
            [a["name"] for a in s["args"] if a.get("free") and a["name"] in args]
            for s, args in calls
        ]
        sample = {"messages": messages, "tools": tools, "expected": expected}
        if chatty:
            sample["chatty"] = True
        if any(free):
            sample["free_text_args"] = free
        if kind_roll < 0.45:
            return {"kind": "tool_call", **sample}
        answers = []
        for s, _ in calls:
            res = self.tool_result()
            messages.append({"role": "tool", "content": dumps(res)})
            answers.append(self.answer_from_result(s, res))
        messages.append({"role": "assistant", "content": " ".join(answers)})
        return {"kind": "tool_loop", **sample}

    # ---------------------------------------------------------------- extraction
    def person_facts(self) -> tuple[str, list[tuple[str, Any]]]:
        """A sentence about one person and the facts it states, as (kind, value) pairs."""
        r = self.r
        first, last = r.choice(self.p.first), r.choice(self.p.last)
        if r.random() < 0.3:
            first = self.made_up_word().capitalize()
        if r.random() < 0.3:
            last = self.made_up_word().capitalize()
        full = f"{first} {last}"
        kinds = [
            "age",
            "city",
            "job",
            "company",
            "email",
            "phone",
            "product",
            "quantity",
            "price",
            "date",
            "color",
            "member",
            "country",
        ]
        chosen = r.sample(kinds, r.randint(2, 5))
        facts: list[tuple[str, Any]] = [("name", full)]
        frags = []
        for k in chosen:
            if k == "age":
                v: Any = r.randint(5, 95)
                f = r.choice([f"is {v} years old", f"is aged {v}", f"turned {v} this year"])
            elif k == "city":
                v = self.place() if r.random() < 0.75 else self.made_up_word().capitalize()
                f = r.choice([f"lives in {v}", f"is based in {v}", f"has a home in {v}"])
            elif k == "job":
                v = r.choice(pools.JOBS)
                f = r.choice([f"works as a {v}", f"is a {v} by trade", f"has a job as a {v}"])
            elif k == "company":
                v = r.choice(pools.COMPANIES)
                f = r.choice([f"works at {v}", f"is employed by {v}"])
            elif k == "email":
                v = f"{first.lower()}.{last.lower()}@{r.choice(['example.com', 'mail.test', 'post.example'])}"
                f = r.choice([f"can be reached at {v}", f"has the email {v}"])
            elif k == "phone":
                v = f"+{r.randint(1, 99)} {r.randint(10, 999)} {r.randint(100, 999)} {r.randint(1000, 9999)}"
                f = r.choice([f"has the phone number {v}", f"can be called at {v}"])
            elif k == "product":
                v = r.choice(pools.PRODUCTS)
                f = r.choice([f"bought a {v}", f"wants a new {v}"])
            elif k == "quantity":
                v = r.randint(1, 500)
                f = r.choice([f"ordered {v} items", f"has {v} boxes in stock"])
            elif k == "price":
                v = self.number() if r.random() < 0.7 else r.randint(1, 900)
                v = abs(v)
                f = r.choice(
                    [
                        f"paid {dumps(v)} dollars",
                        f"spent {dumps(v)} euros",
                        f"has a bill of {dumps(v)}",
                    ]
                )
            elif k == "date":
                v = f"{r.randint(1990, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
                f = r.choice([f"has an appointment on {v}", f"arrives on {v}", f"started on {v}"])
            elif k == "color":
                v = r.choice(pools.COLORS)
                f = r.choice([f"likes the color {v}", f"has a {v} car"])
            elif k == "member":
                v = r.random() < 0.5
                f = "is a member of the club" if v else "is not a member of the club"
            else:
                v = r.choice(pools.COUNTRIES_CAPITALS)[0]
                f = r.choice([f"was born in {v}", f"holds a passport from {v}"])
            facts.append((k, v))
            frags.append(f)
        if r.random() < 0.5:
            sentence = f"{full} " + join_and(frags) + "."
        else:
            sents = [f"{full} {frags[0]}."] + [f"{first} {f}." for f in frags[1:]]
            sentence = " ".join(sents)
        return sentence, facts

    FIELD_ALIASES: dict[str, tuple[list[str], str]] = {
        "name": (
            [
                "name",
                "full_name",
                "person",
                "customer_name",
                "person_name",
                "contact",
                "guest",
                "patient",
                "employee",
            ],
            "string",
        ),
        "age": (["age", "age_years", "years"], "integer"),
        "city": (["city", "location", "hometown", "town", "home_city", "residence"], "string"),
        "job": (["job", "occupation", "profession", "role", "job_title"], "string"),
        "company": (["company", "employer", "organization", "workplace"], "string"),
        "email": (["email", "email_address", "contact_email"], "string"),
        "phone": (["phone", "phone_number", "mobile"], "string"),
        "product": (["product", "item", "purchase"], "string"),
        "quantity": (["quantity", "count", "num_items", "items"], "integer"),
        "price": (["price", "cost", "amount", "total", "amount_paid"], "number"),
        "date": (["date", "visit_date", "start_date", "day"], "string"),
        "color": (["color", "favorite_color", "colour"], "string"),
        "member": (["is_member", "member", "has_membership"], "boolean"),
        "country": (["country", "birth_country", "nationality"], "string"),
    }

    def schema_fields(self, facts: list[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        r = self.r
        pick = [f for f in facts if f[0] != "name" or r.random() < 0.8]
        if len(pick) > 1 and r.random() < 0.4:
            pick = r.sample(pick, r.randint(1, len(pick) - 1)) if len(pick) > 2 else pick
        props: dict[str, Any] = {}
        obj: dict[str, Any] = {}
        for kind, v in pick:
            aliases, typ = self.FIELD_ALIASES[kind]
            alias = r.choice(aliases)
            if kind == "price" and isinstance(v, int):
                typ = "number"
            props[alias] = {"type": typ}
            obj[alias] = v
        return props, obj

    def labelled_record(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """A sentence that names each field explicitly (arbitrary field names: copy, don't guess)."""
        r = self.r
        names: set[str] = set()
        props: dict[str, Any] = {}
        obj: dict[str, Any] = {}
        frags = []
        for _ in range(r.randint(1, 4)):
            fn = self.arg_name(names)
            names.add(fn)
            typ = r.choice(["string", "integer", "number", "boolean"])
            v = {
                "string": self.string_value,
                "integer": self.integer,
                "number": self.number,
                "boolean": lambda: r.random() < 0.5,
            }[typ]()
            props[fn] = {"type": typ}
            obj[fn] = v
            vt = (
                ("true" if v else "false")
                if isinstance(v, bool)
                else dumps(v)
                if not isinstance(v, str)
                else v
            )
            frags.append(
                r.choice([f"the {fn.replace('_', ' ')} is {vt}", f"{fn} is {vt}", f"{fn}: {vt}"])
            )
        lead = r.choice(["Record: ", "Note that ", "Log entry: ", "", "Details: "])
        text = lead + join_and(frags) + "."
        return text[0].upper() + text[1:], props, obj

    def extraction_sample(self) -> dict[str, Any]:
        r = self.r
        if r.random() < 0.25:
            text, props, obj = self.labelled_record()
            task = "extract_labelled"
        else:
            text, facts = self.person_facts()
            props, obj = self.schema_fields(facts)
            task = "extract"
        schema = {"type": "object", "properties": props, "required": list(props)}
        s = dumps(schema)
        messages: list[dict[str, Any]] = []
        if r.random() < 0.5:
            sys_text = r.choice(
                [
                    f"Extract the fields from the user's text as JSON matching this schema: {s}",
                    f"Reply with a JSON object that follows this JSON Schema: {s}",
                    f"You extract data. Output JSON for this schema:\n{s}",
                ]
            )
            messages.append({"role": "system", "content": sys_text})
            messages.append({"role": "user", "content": text})
        else:
            user = r.choice(
                [
                    f"Extract JSON matching this schema: {s}\nText: {text}",
                    f"{text}\nExtract the data as JSON with this schema: {s}",
                    f"Schema: {s}\nText: {text}\nReturn the JSON.",
                ]
            )
            messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": dumps(obj)})
        return {
            "kind": task,
            "messages": messages,
            "tools": None,
            "expected": obj,
            "schema": schema,
        }

    # ---------------------------------------------------------------- JSON with given keys
    KEY_PAIRS = [
        ("question", "answer"),
        ("expression", "result"),
        ("problem", "solution"),
        ("input", "output"),
        ("query", "reply"),
        ("topic", "value"),
    ]

    def free_line(self, topic: str) -> str:
        r = self.r
        return r.choice(
            [
                f"Why did the {topic} cross the road?",
                f"To see the {r.choice(pools.WORDS)}.",
                f"The {topic} is {r.choice(pools.COLORS)}.",
                f"A {topic} met a {r.choice(ANIMALS)[0]}.",
                f"Because it was {r.choice(OPPOSITES)[0]}.",
                f"What do you call a {r.choice(OPPOSITES)[0]} {topic}?",
            ]
        )

    def random_keys(self, n: int) -> list[str]:
        keys: list[str] = []  # a list, not a set: set order varies with PYTHONHASHSEED
        while len(keys) < n:
            keys.append(self.arg_name(set(keys)))
        return keys

    def json_keys_sample(self) -> dict[str, Any]:
        r = self.r
        mode = r.random()
        if mode < 0.3:
            text, facts = self.person_facts()
            pick = r.sample(facts, min(len(facts), r.randint(2, 3)))
            keys = [r.choice(self.FIELD_ALIASES[k][0]) for k, _ in pick]
            if len(set(keys)) < len(keys):
                keys = [f"{k}_{i}" for i, k in enumerate(keys)]
            obj = {k: v for k, (_, v) in zip(keys, pick, strict=True)}
            prompt = text
        else:
            if mode < 0.55:
                a, b = r.randint(0, 50), r.randint(0, 50)
                op, sym, val = r.choice(
                    [("plus", "+", a + b), ("minus", "-", a - b), ("times", "*", a * b)]
                )
                q, subject, answer = f"What is {a} {op} {b}?", f"{a} {sym} {b}", val
            elif mode < 0.75:
                country, capital = r.choice(pools.COUNTRIES_CAPITALS)
                q, subject, answer = f"What is the capital of {country}?", country, capital
            else:
                animal, sound, legs = r.choice(ANIMALS)
                q, subject, answer = f"What sound does a {animal} make?", animal, sound
                if r.random() < 0.4:
                    q, answer = f"How many legs does a {animal} have?", legs
            keys = list(r.choice(self.KEY_PAIRS)) if r.random() < 0.4 else self.random_keys(2)
            obj = {keys[0]: subject, keys[1]: answer}
            prompt = q
        if self.more and r.random() < 0.5:
            quoted = [f"'{k}'" if r.random() < 0.5 else f'"{k}"' for k in keys]
            klist = join_and(quoted)
            instr = r.choice(
                [
                    f"Return the result as a JSON with {klist} keys.",
                    f"Return the result as JSON with the keys {klist}.",
                    f"Output a JSON object with {klist}.",
                    f"Format the answer as JSON with {klist} keys.",
                ]
            ) + r.choice(
                [
                    "",
                    " Return nothing other than JSON.",
                    " Only JSON, nothing else.",
                    " Do not write anything else.",
                ]
            )
            if mode >= 0.3 and r.random() < 0.4:  # a request with no fixed answer
                topic = r.choice([r.choice(pools.WORDS), r.choice(ANIMALS)[0], self.place()])
                prompt = f"Tell me a {r.choice(['joke', 'fact', 'story', 'riddle'])} about {topic}."
                obj = {keys[0]: self.free_line(topic), keys[1]: self.free_line(topic)}
        else:
            quoted = [f'"{k}"' if r.random() < 0.7 else k for k in keys]
            klist = join_and(quoted)
            instr = r.choice(
                [
                    f"Reply in JSON with keys {klist}.",
                    f"Answer as a JSON object with the keys {klist}.",
                    f"Respond only with JSON containing {klist}.",
                    f"Give JSON with keys {klist}.",
                ]
            )
        messages: list[dict[str, Any]] = []
        if r.random() < 0.3:
            messages.append({"role": "system", "content": r.choice(DEFAULT_SYSTEMS)})
        messages.append(
            {
                "role": "user",
                "content": f"{prompt} {instr}" if r.random() < 0.7 else f"{instr}\n{prompt}",
            }
        )
        messages.append({"role": "assistant", "content": dumps(obj)})
        return {
            "kind": "json_keys",
            "messages": messages,
            "tools": None,
            "expected_keys": keys,
            "expected": obj,
        }

    # ---------------------------------------------------------------- simple chat
    def simple_qa(self) -> tuple[str, str]:
        r = self.r
        k = r.random()
        if k < 0.2:
            return r.choice(GREETINGS)
        if k < 0.4:
            a, b = r.randint(0, 20), r.randint(0, 20)
            op, val = r.choice([("plus", a + b), ("minus", a - b), ("times", a * b)])
            q = r.choice(
                [f"What is {a} {op} {b}?", f"what's {a} {op} {b}", f"Compute {a} {op} {b}."]
            )
            return q, r.choice([f"{a} {op} {b} is {val}.", f"{val}.", f"It is {val}."])
        if k < 0.55:
            country, capital = r.choice(pools.COUNTRIES_CAPITALS)
            return (
                r.choice([f"What is the capital of {country}?", f"capital of {country}?"]),
                f"The capital of {country} is {capital}.",
            )
        if k < 0.65:
            animal, sound, legs = r.choice(ANIMALS)
            if r.random() < 0.5:
                return f"What sound does a {animal} make?", f"A {animal} says {sound}."
            return f"How many legs does a {animal} have?", f"A {animal} has {legs} legs."
        if k < 0.75:
            thing, color = r.choice(THING_COLORS)
            return f"What color is {thing}?", f"{thing[0].upper() + thing[1:]} is {color}."
        if k < 0.82:
            w, o = r.choice(OPPOSITES)
            return f"What is the opposite of {w}?", f"The opposite of {w} is {o}."
        if k < 0.9:
            i = r.randrange(7)
            return (
                f"What day comes after {DAYS[i]}?",
                f"{DAYS[(i + 1) % 7]} comes after {DAYS[i]}.",
            )
        phrase = r.choice([self.person(), self.place(), r.choice(pools.WORDS), self.pseudo_word()])
        return r.choice([f"Repeat after me: {phrase}", f'Say "{phrase}".']), phrase

    def small_talk_turn(self) -> tuple[str, str]:
        """Small talk and a reply that fits it, in one of a few casings and punctuations."""
        r = self.r
        phrases, replies = r.choice(self.p.small_talk)
        q = r.choice(phrases)
        if q.endswith("?"):
            q = q if r.random() < 0.8 else q[:-1]
        else:
            q += r.choice(["", "", "!", "."])
        if r.random() < 0.2:
            q = q.lower()
        return q, r.choice(replies)

    def with_small_talk(self, request: str) -> str:
        """The request with small talk before it (a greeting, "How are you?", an acknowledgement)
        or after it (thanks, a farewell), from the split's pool."""
        r = self.r
        before = r.random() < 0.5
        phrase = r.choice(r.choice(self.p.talk_openers if before else self.p.talk_closers)[0])
        if before:
            if phrase.endswith("?"):
                return f"{phrase} {request}"
            return f"{phrase}{r.choice(['!', '.', ','])} {request}"
        if request[-1] not in ".?!":
            request += "."  # a free-text phrase may end the request: the talk must not extend it
        return f"{request} {phrase}{r.choice(['', '!', '.'])}"

    def chat_sample(self) -> dict[str, Any]:
        r = self.r
        messages: list[dict[str, Any]] = []
        if r.random() < 0.5:
            messages.append({"role": "system", "content": r.choice(DEFAULT_SYSTEMS)})
        for _ in range(1 if r.random() < 0.8 else r.randint(2, 3)):
            q, a = self.simple_qa()
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return {"kind": "chat", "messages": messages, "tools": None}

    # ---------------------------------------------------------------- prose
    def story(self) -> str:
        r = self.r
        name = r.choice(self.p.first)
        friend = r.choice([n for n in self.p.first if n != name])
        animal = r.choice(ANIMALS)[0]
        place = r.choice(self.p.places)
        thing = r.choice(pools.PRODUCTS)
        color = r.choice(pools.COLORS)
        feel = r.choice(["happy", "sad", "curious", "tired", "excited", "scared", "proud", "calm"])
        sents = [
            r.choice(
                [
                    f"Once upon a time, there was a little {animal} named {name}.",
                    f"{name} lived in {place} with a {color} {animal}.",
                    f"One morning, {name} woke up early in {place}.",
                ]
            ),
            r.choice(
                [
                    f"{name} liked to play with a {color} {thing}.",
                    f"Every day, {name} walked to the park with {friend}.",
                    f"{name} had a small {thing} that was very old.",
                ]
            ),
            r.choice(
                [
                    f"One day, the {thing} was gone.",
                    "Then it started to rain.",
                    f"Suddenly, {friend} saw a {animal} near the river.",
                    "The sun was warm and the sky was blue.",
                ]
            ),
            r.choice(
                [
                    f"{name} felt {feel}.",
                    f'{friend} said, "Let\'s go and look for it!"',
                    f'"What is that?" asked {name}.',
                    "They ran as fast as they could.",
                ]
            ),
            r.choice(
                [
                    "They looked under the tree and behind the house.",
                    f"The {animal} helped them find the way home.",
                    f"After a while, they found the {thing} in the garden.",
                    f"{friend} shared an apple with {name}.",
                ]
            ),
            r.choice(
                [
                    f"In the end, {name} and {friend} were {feel} and went home.",
                    f"From that day on, {name} always took good care of the {thing}.",
                    f"That night, {name} slept well and dreamed of {place}.",
                    "It was a good day.",
                ]
            ),
        ]
        if r.random() < 0.5:
            sents.insert(
                2,
                r.choice(
                    [
                        f"{name} was {r.randint(3, 12)} years old.",
                        f"The {animal} said {r.choice(ANIMALS)[1]}.",
                        f"There were {r.randint(2, 20)} birds on the roof.",
                    ]
                ),
            )
        return " ".join(sents)

    def prose_sample(self) -> dict[str, Any]:
        paras = [self.story() for _ in range(self.r.randint(1, 3))]
        return {"kind": "prose", "text": "\n\n".join(paras)}

    # ---------------------------------------------------------------- copy drills
    def drill_value(self) -> Any:
        r = self.r
        k = r.random()
        if k < 0.55:
            return self.string_value()
        if k < 0.75:
            return self.integer()
        if k < 0.92:
            return self.number()
        return r.random() < 0.5

    def drill_sample(self) -> dict[str, Any]:
        """Short copying exercises: repeat a made-up string, recall a value by its key, restate as JSON."""
        r = self.r
        k = r.random()
        messages: list[dict[str, Any]] = []
        if k < 0.3:
            x = " ".join(value_str(self.drill_value()) for _ in range(r.choice([1, 1, 2, 3])))
            q = r.choice(
                [
                    "Repeat after me: {x}",
                    'Say "{x}".',
                    "Copy this exactly: {x}",
                    "Echo: {x}",
                    "Please repeat: {x}",
                    "{x}\nRepeat that.",
                ]
            ).format(x=x)
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": x}]
            return {"kind": "drill", "messages": messages, "tools": None}
        keys: list[str] = []
        for _ in range(r.randint(1, 5)):
            keys.append(self.arg_name(set(keys)))
        vals = [self.drill_value() for _ in keys]
        style = r.randrange(4)
        facts = [
            (
                f"{kk} = {value_str(v)}"
                if style == 0
                else f"{kk}: {value_str(v)}"
                if style == 1
                else f"the {kk.replace('_', ' ')} is {value_str(v)}"
                if style == 2
                else f"{kk} {value_str(v)}"
            )
            for kk, v in zip(keys, vals, strict=True)
        ]
        ftext = join_and(facts) if style >= 2 else ", ".join(facts)
        if k < 0.65:
            j = r.randrange(len(keys))
            q = r.choice(
                [
                    f"{ftext}. What is the {keys[j].replace('_', ' ')}?",
                    f"Given {ftext}: what is {keys[j]}?",
                    f"Remember: {ftext}.\nWhat is {keys[j]}?",
                ]
            )
            a = value_str(vals[j])
            if r.random() < 0.4:
                q += r.choice([f' Reply in JSON with the key "{keys[j]}".', " Answer in JSON."])
                a = dumps({keys[j]: vals[j]})
        else:
            pick = sorted(r.sample(range(len(keys)), r.randint(1, len(keys))))
            q = r.choice(
                [
                    f"Write as JSON: {ftext}.",
                    f"{ftext}.\nReturn this as a JSON object.",
                    f"Turn this into JSON: {ftext}",
                ]
            )
            if len(pick) < len(keys):
                q += (
                    ("" if q.endswith(".") else ".")
                    + " Only "
                    + join_and([f'"{keys[i]}"' for i in pick])
                    + "."
                )
            a = dumps({keys[i]: vals[i] for i in pick})
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return {"kind": "drill", "messages": messages, "tools": None}

    # ---------------------------------------------------------------- mix
    def sample(self) -> dict[str, Any]:
        k = self.r.random()
        tools, extraction, json_keys, chat, drill = self.thresholds
        if k < tools:
            return self.tool_sample()
        if k < extraction:
            return self.extraction_sample()
        if k < json_keys:
            return self.json_keys_sample()
        if k < chat:
            return self.chat_sample()
        if k < drill:
            return self.drill_sample()
        return self.prose_sample()

    def easy_sample(self) -> dict[str, Any]:
        """The first stage of training: short copying exercises and simple single calls."""
        k = self.r.random()
        if k < 0.45:
            return self.drill_sample()
        if k < 0.8:
            return self.tool_sample(easy=True)
        if k < 0.92:
            return self.extraction_sample()
        return self.chat_sample()


ANIMALS = [
    ("dog", "woof", 4),
    ("cat", "meow", 4),
    ("cow", "moo", 4),
    ("duck", "quack", 2),
    ("sheep", "baa", 4),
    ("horse", "neigh", 4),
    ("owl", "hoot", 2),
    ("pig", "oink", 4),
    ("frog", "ribbit", 4),
    ("lion", "roar", 4),
    ("chicken", "cluck", 2),
    ("goat", "maa", 4),
]
THING_COLORS = [
    ("the sky", "blue"),
    ("grass", "green"),
    ("snow", "white"),
    ("a banana", "yellow"),
    ("coal", "black"),
    ("a tomato", "red"),
    ("an orange", "orange"),
    ("milk", "white"),
    ("the sun", "yellow"),
    ("a lemon", "yellow"),
    ("chocolate", "brown"),
]
OPPOSITES = [
    ("hot", "cold"),
    ("big", "small"),
    ("up", "down"),
    ("fast", "slow"),
    ("day", "night"),
    ("happy", "sad"),
    ("open", "closed"),
    ("old", "new"),
    ("light", "dark"),
    ("left", "right"),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
GREETINGS = [
    ("Hi!", "Hello! How can I help you today?"),
    ("Hello", "Hi there! How can I help?"),
    ("hey", "Hey! What can I do for you?"),
    ("Good morning!", "Good morning! How can I help you?"),
    ("How are you?", "I'm doing well, thank you! How can I help you?"),
    ("Thank you!", "You're welcome!"),
    ("Thanks a lot", "You're welcome! Happy to help."),
    ("Bye!", "Goodbye! Have a nice day."),
    ("What is your name?", "My name is Brisk."),
    ("Who are you?", "I am Brisk, a small assistant."),
    ("What can you do?", "I can answer simple questions, call tools and write JSON."),
    ("Good night", "Good night! Sleep well."),
    ("Are you a robot?", "I am a small language model."),
    ("Can you help me?", "Of course! What do you need?"),
    ("ok", "Great. Anything else?"),
]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def join_and(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def value_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else dumps(v)


def generate(
    n: int, seed: int, split: str, easy: bool = False, **options: Any
) -> list[dict[str, Any]]:
    """``n`` samples of ``split`` (first-stage ones with ``easy``); ``options`` are Gen's."""
    g = Gen(seed, split, **options)
    return [g.easy_sample() if easy else g.sample() for _ in range(n)]


def call_prompt(sample: dict[str, Any]) -> dict[str, Any]:
    """A tool sample cut after the user's turn: the model must produce the calls."""
    cut = next(i for i, m in enumerate(sample["messages"]) if m["role"] == "assistant")
    return {**sample, "prompt_messages": sample["messages"][:cut]}


def generate_eval(
    seed: int, n_per_task: int, request_order: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Held-out samples per task. ``request_order`` changes only the order of the arguments in the
    calls (``expected`` compares as a mapping) and so the perplexity samples' assistant turns."""
    g = Gen(seed, "eval", request_order=request_order)
    out: dict[str, list[dict[str, Any]]] = {
        "tool_call": [],
        "extract": [],
        "extract_labelled": [],
        "json_keys": [],
        "ppl": [],
    }
    while (
        min(len(out["tool_call"]), len(out["extract"]), len(out["extract_labelled"])) < n_per_task
    ):
        s = g.tool_sample()
        if s["kind"] in ("tool_call", "tool_loop") and len(out["tool_call"]) < n_per_task:
            out["tool_call"].append(call_prompt(s))
        e = g.extraction_sample()
        if len(out[e["kind"]]) < n_per_task:
            out[e["kind"]].append({**e, "prompt_messages": e["messages"][:-1]})
    for _ in range(n_per_task):
        j = g.json_keys_sample()
        out["json_keys"].append({**j, "prompt_messages": j["messages"][:-1]})
    out["drill"] = []
    for _ in range(n_per_task):
        d = g.drill_sample()
        out["drill"].append(
            {
                **d,
                "prompt_messages": d["messages"][:-1],
                "expected_text": d["messages"][-1]["content"],
            }
        )
    out["ppl"] = [g.sample() for _ in range(2 * n_per_task)]
    # Calls with a free-text argument stated as a phrase (``--free-text-args``), from a generator
    # of their own so that the sets above stay as they were.
    g = Gen(seed + 7, "eval", request_order=request_order, free_text_args=True)
    out["tool_call_free_text"] = []
    while len(out["tool_call_free_text"]) < n_per_task:
        s = g.tool_sample()
        if s.get("free_text_args"):
            out["tool_call_free_text"].append(call_prompt(s))
    # Calls of tools described by docstrings, of unit conversions and asked as questions
    # (``--docstrings``, ``--conversions``, ``--topic-questions``), from a generator of their own.
    g = Gen(
        seed + 11,
        "eval",
        request_order=request_order,
        docstrings=0.5,
        conversions=0.3,
        questions=0.6,
        readers=0.25,
    )
    out["tool_call_natural"] = []
    while len(out["tool_call_natural"]) < n_per_task:
        s = g.tool_sample()
        if s["kind"] in ("tool_call", "tool_loop"):
            prompt = call_prompt(s)
            # docstrings make prompts long: keep those that fit the bundled model's context of
            # 1,024 tokens with room for the reply (at most ~0.55 tokens a character)
            if len(dumps(s["tools"])) + len(dumps(prompt["prompt_messages"])) <= 1600:
                out["tool_call_natural"].append(prompt)
    # Requests with held-out small talk around them ("Hi there! ...", "... Cheers"), which must
    # still call (``--chatty-requests``).
    g = Gen(seed + 17, "eval", request_order=request_order, chatty_requests=1.0)
    out["tool_call_chatty"] = []
    while len(out["tool_call_chatty"]) < n_per_task:
        s = g.tool_sample()
        if s["kind"] in ("tool_call", "tool_loop"):
            out["tool_call_chatty"].append(call_prompt(s))
    # Small talk with tools offered, which must be answered in text (``--small-talk``: held-out
    # phrases and tools; the 8% of tool samples where no tool fits a simple question among them).
    g = Gen(seed + 13, "eval", request_order=request_order, small_talk=0.5)
    out["tool_none"] = []
    while len(out["tool_none"]) < n_per_task:
        s = g.tool_sample()
        if s["kind"] == "tool_none":
            out["tool_none"].append(
                {**call_prompt(s), "expected_text": s["messages"][-1]["content"]}
            )
    return out


def share_arg(name: str) -> Callable[[str], float]:
    """An argparse type: a float in [0, 1] (``check_share`` under ``name``)."""

    def parse(text: str) -> float:
        try:
            return check_share(name, float(text))
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=Path("training/out/data"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--num-train", type=int, default=120_000)
    ap.add_argument(
        "--num-easy",
        type=int,
        default=0,
        help="samples of the first training stage (easy.jsonl: drills and simple calls)",
    )
    ap.add_argument("--num-eval", type=int, default=200, help="held-out samples per eval task")
    ap.add_argument(
        "--more-phrasings",
        action="store_true",
        help="also write the request styles of the second training set (see Gen)",
    )
    ap.add_argument(
        "--request-order",
        action="store_true",
        help="write tool-call arguments in the order the request mentions them (see Gen)",
    )
    ap.add_argument(
        "--free-text-args",
        action="store_true",
        help="give some tools a free-text argument stated as a phrase (see Gen)",
    )
    ap.add_argument(
        "--free-text-share",
        type=share_arg("--free-text-share"),
        default=FREE_TEXT_SHARE,
        help="with --free-text-args: share of tools with fewer than four arguments that get one",
    )
    ap.add_argument(
        "--tool-share",
        type=share_arg("--tool-share"),
        default=DEFAULT_TOOL_SHARE,
        help="share of training samples that offer tools (the other kinds keep their proportions)",
    )
    ap.add_argument(
        "--many-tools",
        action="store_true",
        help="offer 3-5 tools more often in the training samples (see Gen)",
    )
    # Shares in [0, 1], 0 by default (which draws no random number; see Gen): flag -> help.
    for flag, help_text in (
        ("--open-verbs", "share of training tools whose verb is drawn from an open set"),
        ("--other-scripts", "share of training string values written in Cyrillic or Greek letters"),
        ("--docstrings", "share of tools described by a docstring with Args and Returns sections"),
        ("--conversions", "share of tools that convert a number between two units"),
        ("--topic-questions", "share of one-argument requests of reading tools asked as questions"),
        ("--reader-tools", "share of tools made with a reading verb and one argument"),
        ("--conversion-distractors", "share of tool samples offering a conversion not asked for"),
        ("--native-names", "share of tool samples creating a record named in CJK or kana"),
        ("--small-talk", "share of tool samples where the user makes small talk (no tool call)"),
        ("--chatty-requests", "share of tool requests with small talk around them (still a call)"),
        ("--place-readers", "share of reading tools whose one argument is a place (city, ...)"),
    ):
        ap.add_argument(flag, type=share_arg(flag), default=0.0, help=f"{help_text} (see Gen)")
    args = ap.parse_args()
    for flag, count in (
        ("--num-train", args.num_train),
        ("--num-easy", args.num_easy),
        ("--num-eval", args.num_eval),
    ):
        if count < 0:
            ap.error(f"{flag} {count}: not negative")
    if args.free_text_share != FREE_TEXT_SHARE and not args.free_text_args:
        ap.error("--free-text-share needs --free-text-args")
    args.out.mkdir(parents=True, exist_ok=True)
    order = args.request_order
    train = generate(
        args.num_train,
        args.seed,
        "train",
        more_phrasings=args.more_phrasings,
        request_order=order,
        free_text_args=args.free_text_args,
        tool_share=args.tool_share,
        many_tools=args.many_tools,
        open_verbs=args.open_verbs,
        other_scripts=args.other_scripts,
        free_text_share=args.free_text_share,
        docstrings=args.docstrings,
        conversions=args.conversions,
        questions=args.topic_questions,
        readers=args.reader_tools,
        conversion_distractors=args.conversion_distractors,
        native_names=args.native_names,
        small_talk=args.small_talk,
        chatty_requests=args.chatty_requests,
        place_readers=args.place_readers,
    )
    with open(args.out / "train.jsonl", "w", encoding="utf-8") as f:
        for s in train:
            f.write(dumps(s) + "\n")
    if args.num_easy:
        with open(args.out / "easy.jsonl", "w", encoding="utf-8") as f:
            for s in generate(
                args.num_easy, args.seed + 2, "train", easy=True, request_order=order
            ):
                f.write(dumps(s) + "\n")
        print(f"wrote {args.num_easy} first-stage samples to {args.out}/easy.jsonl")
    ev = generate_eval(args.seed + 1, args.num_eval, request_order=order)
    with open(args.out / "eval.json", "w", encoding="utf-8") as f:
        json.dump(ev, f, ensure_ascii=False)
    counts: dict[str, int] = {}
    for s in train:
        counts[s["kind"]] = counts.get(s["kind"], 0) + 1
    print(f"wrote {len(train)} training samples to {args.out}/train.jsonl: {counts}")
    print(f"wrote held-out eval set: { {k: len(v) for k, v in ev.items()} }")


if __name__ == "__main__":
    main()
