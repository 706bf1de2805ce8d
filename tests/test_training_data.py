"""training/generate_data.py: the first training set is pinned (the shipped models were trained on
it, and training/build_all.sh must rebuild them), the second set's extra phrasings keep every
tool-call argument copyable from the request, and request order reorders the arguments only."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from training import pools
from training.generate_data import (
    FREE_TEXT_ARG_NAMES,
    GREETINGS,
    HELDOUT_WORDS,
    OTHER_SCRIPTS,
    READING_VERBS,
    dumps,
    generate,
    generate_eval,
    value_str,
)

# sha256 of the first 300 lines of train.jsonl written by `generate_data --seed 1234
# --request-order`, the set the shipped models were trained on (training/build_all.sh); a change
# to the generator that moves it breaks the rebuild. Without --request-order: the set the models
# shipped before 2026-11-30's rebuild were trained on, which the flag must leave as it was.
FIRST_SET_300_SHA256 = "cb717666a8df93e9b9446492c76fae72904408b1c94306bd46601c9a99bc828d"
SCHEMA_ORDER_FIRST_SET_300_SHA256 = (
    "97cab22ac70c274e42859e4cd879579b7a8e7d4d9c5dd2f8922b351ac6691883"
)
# sha256 of generate_eval(1235, 20, request_order=True) before the free-text set was added: the
# held-out sets the figures in the README were measured on.
EVAL_SET_20_SHA256 = "911d43976cd6d4c44c88e25ac24c7a35508b45feed5231b44f1e439005480265"


def test_first_training_set_is_unchanged() -> None:
    for request_order, expected in (
        (True, FIRST_SET_300_SHA256),
        (False, SCHEMA_ORDER_FIRST_SET_300_SHA256),
    ):
        h = hashlib.sha256()
        for s in generate(300, 1234, "train", request_order=request_order):
            h.update((dumps(s) + "\n").encode())
        assert h.hexdigest() == expected, request_order


def user_and_calls(sample: dict) -> tuple[str, list[dict]]:
    user = next(m["content"] for m in sample["messages"] if m["role"] == "user")
    calls = next(m for m in sample["messages"] if m["role"] == "assistant")["tool_calls"]
    return user, [c["function"] for c in calls]


def test_more_phrasings_write_the_new_styles_and_keep_values_copyable() -> None:
    samples = generate(4000, 4321, "train", more_phrasings=True)
    tool_samples = [s for s in samples if s["kind"] in ("tool_call", "tool_loop")]
    calls = [user_and_calls(s) for s in tool_samples]
    assert any("(" in u and f["name"] + "(" in u for u, fs in calls for f in fs[:1])
    assert any("Use the tool." in u for u, _ in calls)
    assert any(f"'{v}'" in u for u, fs in calls for f in fs for v in f["arguments"].values())
    for (user, functions), sample in zip(calls, tool_samples, strict=True):
        schemas = {
            t["function"]["name"]: t["function"]["parameters"]["properties"]
            for t in sample["tools"]
        }
        for f in functions:
            for name, v in f["arguments"].items():
                p = schemas[f["name"]][name]
                if p["type"] in ("integer", "number"):
                    assert p.get("minimum", -1e9) <= v <= p.get("maximum", 1e9)
                    assert p.get("exclusiveMinimum", -1e9) < v < p.get("exclusiveMaximum", 1e9)
                text = v if isinstance(v, str) else json.dumps(v)
                if isinstance(v, bool):
                    text = "true" if v else "false"
                assert text in user, (user, f)
    bounded = 0
    for s in samples:
        for tool in s.get("tools") or []:
            props = tool["function"]["parameters"]["properties"]
            bounded += any("maximum" in p or "exclusiveMaximum" in p for p in props.values())
    assert bounded > 50
    keys = [s for s in samples if s["kind"] == "json_keys"]
    assert any("Return the result as a JSON with" in s["messages"][-2]["content"] for s in keys)
    for s in keys:
        obj = json.loads(s["messages"][-1]["content"])
        assert list(obj) == s["expected_keys"]
        for k in s["expected_keys"]:
            assert k in s["messages"][-2]["content"]


def mention_position(user: str, name: str, value: object) -> int:
    """Where the request states this argument: its name (spaced or not) or, failing that, its value."""
    found = [user.find(n) for n in (name, name.replace("_", " ")) if user.find(n) >= 0]
    if found:
        return min(found)
    text = value if isinstance(value, str) else json.dumps(value)
    return user.find(text)


def test_request_order_changes_only_the_order_of_the_arguments() -> None:
    plain = generate(1500, 4321, "train", more_phrasings=True)
    ordered = generate(1500, 4321, "train", more_phrasings=True, request_order=True)
    reordered = 0
    for a, b in zip(plain, ordered, strict=True):
        if a["kind"] not in ("tool_call", "tool_loop"):
            assert a == b
            continue
        assert a == b  # dicts compare regardless of key order: the same samples
        user, calls = user_and_calls(b)
        _, plain_calls = user_and_calls(a)
        for f, g in zip(calls, plain_calls, strict=True):
            reordered += list(f["arguments"]) != list(g["arguments"])
            if f"{f['name']}(" in user or len(plain_calls) > 1:
                continue  # call notation, or two calls in one request: positions are ambiguous
            positions = [mention_position(user, k, v) for k, v in f["arguments"].items()]
            assert positions == sorted(positions), (user, f)
    assert reordered > 50


def test_free_text_args_are_stated_as_phrases_and_copied_whole() -> None:
    samples = generate(
        3000, 4321, "train", more_phrasings=True, request_order=True, free_text_args=True
    )
    free_calls = named_dash = 0
    for s in samples:
        if not s.get("free_text_args"):
            continue
        user, calls = user_and_calls(s)
        props = {
            t["function"]["name"]: t["function"]["parameters"]["properties"] for t in s["tools"]
        }
        for f, free in zip(calls, s["free_text_args"], strict=True):
            for name in free:
                v = f["arguments"][name]
                free_calls += 1
                assert name in FREE_TEXT_ARG_NAMES and props[f["name"]][name]["type"] == "string"
                # Copied whole, and the request shows where the phrase ends: at the request's end,
                # a quote or punctuation, never running on into other words.
                at = user.find(v)
                assert at >= 0, (user, f)
                assert user[at + len(v) : at + len(v) + 1] in ("", ".", ",", '"', "'", ")"), user
                named_dash += " named " in user and f" - {v}" in user
    assert free_calls > 150
    assert named_dash > 5
    plain = generate(500, 4321, "train", more_phrasings=True, request_order=True)
    assert not any("free_text_args" in s for s in plain)
    for s in plain:
        for tool in s.get("tools") or []:
            props = tool["function"]["parameters"]["properties"]
            assert not any(p.get("description") == "Free text." for p in props.values())


def test_free_text_share_sets_how_many_tools_get_a_free_text_argument() -> None:
    def tools_with_free_text(share: float | None) -> tuple[int, int]:
        extra = {} if share is None else {"free_text_share": share}
        samples = generate(2000, 4321, "train", request_order=True, free_text_args=True, **extra)
        free = offered = 0
        for s in samples:
            for tool in s.get("tools") or []:
                props = tool["function"]["parameters"]["properties"]
                offered += 1
                free += any(p.get("description") == "Free text." for p in props.values())
        return free, offered

    default, offered = tools_with_free_text(None)
    assert tools_with_free_text(0.2) == (default, offered)  # the default, draw for draw
    doubled, _ = tools_with_free_text(0.4)
    none, _ = tools_with_free_text(0.0)
    assert none == 0 and 1.6 < doubled / default < 2.4
    with pytest.raises(ValueError, match="free_text_share"):
        generate(1, 1, "train", free_text_args=True, free_text_share=1.5)


def test_free_text_share_without_free_text_args_is_refused(tmp_path, capsys, monkeypatch) -> None:
    from training import generate_data

    argv = ["generate_data", "--out", str(tmp_path), "--num-train", "1", "--free-text-share", "0.4"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit):
        generate_data.main()
    assert "--free-text-share needs --free-text-args" in capsys.readouterr().err


def test_held_out_free_text_calls_leave_the_other_eval_sets_as_they_were() -> None:
    ev = generate_eval(1235, 20, request_order=True)
    assert len(ev["tool_call_free_text"]) == 20
    for s in ev["tool_call_free_text"]:
        assert s["prompt_messages"][-1]["role"] == "user"
        assert any(s["free_text_args"])
    own_sets = ("tool_call_free_text", "tool_call_natural", "tool_none", "tool_call_chatty")
    h = hashlib.sha256(dumps({k: v for k, v in ev.items() if k not in own_sets}).encode())
    assert h.hexdigest() == EVAL_SET_20_SHA256


def test_tool_share_sets_the_tool_samples_share_and_keeps_the_other_kinds_proportions() -> None:
    n = 6000
    kinds: dict[float, dict[str, int]] = {}
    for share in (0.4, 0.7):
        counts: dict[str, int] = {}
        for s in generate(n, 77, "train", tool_share=share):
            counts[s["kind"]] = counts.get(s["kind"], 0) + 1
        kinds[share] = counts

    def tools(c: dict[str, int]) -> int:
        return c.get("tool_call", 0) + c.get("tool_loop", 0) + c.get("tool_none", 0)

    # Binomial standard error at n = 6000 is ~0.6 points: 3 points is five of them.
    assert abs(tools(kinds[0.4]) / n - 0.40) < 0.03
    assert abs(tools(kinds[0.7]) / n - 0.70) < 0.03
    # Among the rest, extraction keeps its share (0.18 of 0.60 by default).
    for counts in kinds.values():
        rest = n - tools(counts)
        extraction = counts.get("extract", 0) + counts.get("extract_labelled", 0)
        assert abs(extraction / rest - 0.30) < 0.04
    # The default share is the generator's old mix, draw for draw.
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", tool_share=0.40)
    ]
    with pytest.raises(ValueError, match="tool_share must be in"):
        generate(1, 1, "train", tool_share=1.5)


def test_many_tools_offers_three_to_five_tools_more_often() -> None:
    def tool_counts(many: bool) -> list[int]:
        samples = generate(3000, 91, "train", tool_share=0.7, many_tools=many)
        return [len(s["tools"]) for s in samples if s["kind"] in ("tool_call", "tool_loop")]

    default, many = tool_counts(False), tool_counts(True)
    assert max(default) == max(many) == 5 and min(many) == 1
    # Weights 22/26/24/16/12 against 8/16/24/26/26: 52% and 76% of samples offer 3-5 tools
    # (~2,000 tool samples each, binomial error ~1 point).
    assert abs(sum(n >= 3 for n in default) / len(default) - 0.52) < 0.05
    assert abs(sum(n >= 3 for n in many) / len(many) - 0.76) < 0.05
    # Off (the default), the draws are the generator's old ones: the pinned first set above.


def test_open_verbs_draw_the_verb_of_a_tool_name_from_an_open_set() -> None:
    verbs = {phrase.split()[0] for _, phrase in pools.VERBS}
    extra = set(pools.EXTRA_VERBS)
    held_out = {v for v, _ in pools.HELDOUT_VERBS}
    assert not extra & (verbs | held_out | HELDOUT_WORDS)
    kinds = {"closed": 0, "extra": 0, "made_up": 0}
    stated = [0, 0]
    samples = generate(3000, 92, "train", tool_share=0.7, more_phrasings=True, open_verbs=0.5)
    for s in samples:
        for tool in s.get("tools") or []:
            fn = tool["function"]
            # The description starts with the verb phrase: "Megous the payment."
            verb = fn["description"].split()[0].lower()
            kind = "closed" if verb in verbs else "extra" if verb in extra else "made_up"
            kinds[kind] += 1
            assert verb not in held_out
            if kind != "closed":
                assert verb not in HELDOUT_WORDS
                assert verb in fn["name"].lower(), (verb, fn["name"])
        if s["kind"] in ("tool_call", "tool_loop"):
            # The called function's verb is in the request, to be copied from there (but for the
            # styles that name no verb: "Tell me the linhal entry of Sydney.").
            user, calls = user_and_calls(s)
            descriptions = {t["function"]["name"]: t["function"]["description"] for t in s["tools"]}
            for call in calls:
                verb = descriptions[call["name"]].split()[0].lower()
                stated[verb in user.lower() or call["name"] in user] += 1
    assert stated[1] > 0.9 * sum(stated), stated
    total = sum(kinds.values())
    # Half the verbs stay the closed set's, a quarter each from EXTRA_VERBS and made-up words
    # (several thousand tools: binomial errors under a point).
    assert abs(kinds["closed"] / total - 0.50) < 0.04
    assert abs(kinds["extra"] / total - 0.25) < 0.04
    assert abs(kinds["made_up"] / total - 0.25) < 0.04
    # Off (the default), the draws are the generator's old ones; the held-out split ignores it.
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", open_verbs=0.0)
    ]
    assert [dumps(s) for s in generate(50, 5, "eval")] == [
        dumps(s) for s in generate(50, 5, "eval", open_verbs=0.5)
    ]
    with pytest.raises(ValueError, match="open_verbs must be in"):
        generate(1, 1, "train", open_verbs=1.5)


def test_other_scripts_write_cyrillic_and_greek_values_that_the_calls_copy() -> None:
    letters = {c: i for i, script in enumerate(OTHER_SCRIPTS) for c in script + script.upper()}

    def script_of(value: object) -> int | None:
        """0 (Cyrillic) or 1 (Greek) for a value written in one of them, else None."""
        kinds = {letters.get(c) for c in str(value) if c != " "}
        return kinds.pop() if kinds in ({0}, {1}) else None

    def strings(samples: list[dict]) -> list[object]:
        return [
            v
            for s in samples
            if s["kind"] in ("tool_call", "tool_loop")
            for f in user_and_calls(s)[1]
            for v in f["arguments"].values()
            if isinstance(v, str)
        ]

    def shares(samples: list[dict]) -> tuple[float, float]:
        found = [script_of(v) for v in strings(samples)]
        return found.count(0) / len(found), found.count(1) / len(found)

    samples = generate(2000, 77, "train", tool_share=0.7, other_scripts=0.3)
    # 30% of the values string_value draws, half in each script; some string arguments come from
    # elsewhere (dates, enums), so a quarter of the calls' strings (thousands: errors ~1 point).
    cyrillic, greek = shares(samples)
    assert 0.09 < cyrillic < 0.16 and 0.09 < greek < 0.16, (cyrillic, greek)
    cyrillic, greek = shares(generate(2000, 77, "train", tool_share=0.7))
    assert cyrillic < 0.01 and greek < 0.01, (cyrillic, greek)  # Москва and Αθήνα alone
    # Each such value is copied from the request: it is in the user's words.
    for s in samples:
        if s["kind"] == "tool_call":
            user, functions = user_and_calls(s)
            for f in functions:
                for v in f["arguments"].values():
                    if isinstance(v, str) and script_of(v) is not None:
                        assert v in user, (v, user)
    # Off (the default), the draws are the generator's old ones; the held-out split ignores it.
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", other_scripts=0.0)
    ]
    assert [dumps(s) for s in generate(50, 5, "eval")] == [
        dumps(s) for s in generate(50, 5, "eval", other_scripts=0.5)
    ]
    with pytest.raises(ValueError, match="other_scripts must be in"):
        generate(1, 1, "train", other_scripts=-0.1)


def descriptions_and_calls(samples: list[dict]) -> list[tuple[str, list[dict], dict[str, dict]]]:
    """(request, calls, offered functions by name) of each sample that calls tools."""
    return [
        (*user_and_calls(s), {t["function"]["name"]: t["function"] for t in s["tools"]})
        for s in samples
        if s["kind"] in ("tool_call", "tool_loop")
    ]


def test_docstrings_describe_tools_with_args_and_returns_sections() -> None:
    samples = generate(1500, 31, "train", tool_share=0.8, more_phrasings=True, docstrings=1.0)
    sections = {"Args:": 0, "Returns:": 0}
    tools = 0
    for s in samples:
        for tool in s.get("tools") or []:
            fn = tool["function"]
            tools += 1
            text = fn["description"]
            for section in sections:
                sections[section] += section in text
            if "Args:" in text:
                # one line per argument, each naming it as the schema does
                listed = [line.split(":")[0].strip() for line in text.split("Args:")[1].split("\n")]
                for name in fn["parameters"]["properties"]:
                    assert name in listed, (name, text)
    # Args where a tool has arguments (seven in ten), Returns half the time (thousands of tools).
    assert 0.5 < sections["Args:"] / tools < 0.75, sections
    assert 0.42 < sections["Returns:"] / tools < 0.58, sections
    # The calls still copy every value from the request.
    for user, calls, _ in descriptions_and_calls(samples):
        for call in calls:
            for v in call["arguments"].values():
                if isinstance(v, str) and not isinstance(v, bool):
                    assert v in user, (v, user)
    # Off (the default), the draws are the generator's old ones.
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", docstrings=0.0, conversions=0.0)
    ]
    with pytest.raises(ValueError, match="docstrings must be in"):
        generate(1, 1, "train", docstrings=2.0)


def test_conversions_name_both_units_and_the_request_states_them_in_the_call_s_order() -> None:
    units = {u for u, _ in pools.UNITS}
    held_out = {u for u, _ in pools.HELDOUT_UNITS}
    assert not units & held_out and held_out <= HELDOUT_WORDS
    # nor is a held-out unit a training topic, argument name or word ("calories" was a topic)
    training_words = {w for t in pools.TOPICS + pools.ARG_NAMES + pools.WORDS for w in t.split()}
    assert not held_out & training_words, held_out & training_words
    for split, allowed in (("train", None), ("eval", held_out)):
        samples = generate(3000, 41, split, tool_share=0.8, conversions=0.5)
        found = 0
        for user, calls, functions in descriptions_and_calls(samples):
            for call in calls:
                description = functions[call["name"]]["description"].splitlines()[0]
                m = re.search(
                    r"from (\S+) to (\S+)\.$|^Convert (\S+) to (\S+)\.$|in (\S+) into (\S+)\.$",
                    description,
                )
                if m is None:
                    continue
                src, dst = (g for g in m.groups() if g)
                found += 1
                if allowed is not None:
                    assert {src, dst} <= allowed, (src, dst)
                assert src in call["name"] and dst.lower() in call["name"].lower(), call["name"]
                (value,) = call["arguments"].values()
                assert isinstance(value, (int, float)) and value_str(value) in user, (value, user)
                # the units in the request's order: "Convert 30 celsius to fahrenheit."
                low = user.lower()
                assert src in low and dst in low, (src, dst, user)
                if len(calls) == 1:
                    at = {u: re.search(r"\b" + u + r"\b", low).start() for u in (src, dst)}
                    assert at[src] < at[dst] or "how many" in low, user
        assert found > 200, (split, found)
    # The conversion back is often offered beside one: the units' order picks the tool.
    pairs = 0
    samples = generate(2000, 43, "train", tool_share=0.8, conversions=0.5)
    for _, calls, functions in descriptions_and_calls(samples):
        name = calls[0]["name"]
        if name.count("_to_") == 1 and not name.startswith("convert_"):
            src, dst = name.split("_to_")
            pairs += any(
                f"{dst}_to_{src}" in n or f"{dst}To{src.capitalize()}" in n for n in functions
            )
    assert pairs > 50, pairs
    with pytest.raises(ValueError, match="conversions must be in"):
        generate(1, 1, "train", conversions=-1.0)


def test_topic_questions_ask_a_reading_tool_s_topic_with_its_one_value() -> None:
    samples = generate(3000, 53, "train", tool_share=0.8, more_phrasings=True, questions=1.0)
    asked = 0
    for user, calls, functions in descriptions_and_calls(samples):
        m = re.fullmatch(
            r"(What is the|What's the|Tell me the|How is the|Show me the|I'd like to know the"
            r"|Any|Give me the) (.+?) (in|for|of) (.+?)( today)?(, please)?[.?]",
            user,
        )
        if m is None or len(calls) != 1 or "(" in user or "named" in user or "called" in user:
            continue
        fn = functions[calls[0]["name"]]
        verb = fn["description"].split(" the ")[0].lower()
        if verb not in READING_VERBS:
            continue
        asked += 1
        topic = m.group(2).lower()
        assert fn["description"].lower().startswith(f"{verb} the {topic}"), (user, fn)
        (value,) = calls[0]["arguments"].values()
        assert str(value_str(value) if not isinstance(value, str) else value) in user, (value, user)
    assert asked > 100, asked
    with pytest.raises(ValueError, match="questions must be in"):
        generate(1, 1, "train", questions=1.5)


def test_reader_tools_are_one_argument_tools_with_a_reading_verb() -> None:
    def readers(samples: list[dict]) -> tuple[int, int]:
        tools = [t["function"] for s in samples for t in s.get("tools") or []]
        one = sum(
            len(fn["parameters"]["properties"]) == 1
            and fn["description"].split(" the ")[0].lower() in READING_VERBS
            for fn in tools
        )
        return one, len(tools)

    one, total = readers(generate(2000, 61, "train", tool_share=0.8, readers=0.5))
    before, total_before = readers(generate(2000, 61, "train", tool_share=0.8))
    # Half the tools made as readers (a few of them given a free-text argument too), against the
    # few that a reading verb and one argument give by chance.
    assert one / total > 0.45 and before / total_before < 0.1, (one, total, before, total_before)
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", readers=0.0, questions=0.0)
    ]
    with pytest.raises(ValueError, match="readers must be in"):
        generate(1, 1, "train", readers=-0.5)


def is_conversion(name: str) -> bool:
    return "_to_" in name or re.search(r"[a-z]To[A-Z]", name) is not None


def test_conversion_distractors_offer_a_conversion_the_first_call_does_not_take() -> None:
    def counts(samples: list[dict]) -> tuple[int, int]:
        offered = taken = 0
        for _, calls, functions in descriptions_and_calls(samples):
            if any(is_conversion(n) for n in functions):
                offered += 1
                taken += is_conversion(calls[0]["name"])
        return offered, taken

    options = {"tool_share": 0.8, "conversions": 0.1, "questions": 1.0, "readers": 0.3}
    offered, taken = counts(generate(3000, 71, "train", conversion_distractors=0.5, **options))
    offered_before, taken_before = counts(generate(3000, 71, "train", **options))
    # half the samples offering no conversion gain one, which their first call leaves alone
    assert offered > 1.5 * offered_before, (offered, offered_before)
    assert (offered - taken) > 2 * (offered_before - taken_before), (offered, taken)
    samples = generate(3000, 71, "train", conversion_distractors=0.5, **options)
    assert max(len(s.get("tools") or []) for s in samples) == 5
    # the calls stay derivable from the request: a question names the reading tool's value
    for user, calls, _ in descriptions_and_calls(samples):
        for call in calls:
            for value in call["arguments"].values():
                if isinstance(value, str):
                    assert value in user, (value, user)
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", conversion_distractors=0.0)
    ]
    with pytest.raises(ValueError, match="conversion_distractors must be in"):
        generate(1, 1, "train", conversion_distractors=2.0)


def test_native_names_create_records_named_in_cjk_or_kana_with_a_phrase() -> None:
    samples = generate(3000, 73, "train", tool_share=0.8, request_order=True, native_names=0.2)
    named = 0
    for user, calls, functions in descriptions_and_calls(samples):
        m = re.search(r" ['\"]?([^\s'\"]+)['\"]?(?: \((.+?)\))? - (.+)$", user)
        if len(calls) != 1 or m is None or not re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", m[1]):
            continue
        named += 1
        call = calls[0]
        props = functions[call["name"]]["parameters"]["properties"]
        assert len(props) == 2 and list(call["arguments"]) == [
            a for a in call["arguments"] if a in props
        ]
        # the name first, then the free-text argument, as the request states them; the gloss in
        # brackets is not copied
        name_value, phrase = call["arguments"].values()
        assert name_value == m.group(1) and phrase == m.group(3), (user, call)
        assert list(call["arguments"])[1] in FREE_TEXT_ARG_NAMES
        assert m.group(2) is None or m.group(2) not in str(call["arguments"])
    assert named > 200, named
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", native_names=0.0)
    ]


def test_held_out_natural_calls_use_held_out_units_and_docstrings() -> None:
    ev = generate_eval(1235, 40, request_order=True)
    items = ev["tool_call_natural"]
    assert len(items) == 40
    text = dumps(items)
    assert "Args:" in text
    assert any(
        f"{a}_to_{b}" in text or f"{a}To{b.capitalize()}" in text
        for a, _ in pools.HELDOUT_UNITS
        for b, _ in pools.HELDOUT_UNITS
    )
    assert not any(f"{u}_to_" in text for u, _ in pools.UNITS)


def talk_key(text: str) -> str:
    """Small talk compared as the pools' disjointness is: lowercased, letters and spaces only."""
    return re.sub(r"[^a-z ]", "", text.lower()).strip()


def test_small_talk_answers_in_text_with_tools_offered() -> None:
    samples = generate(4000, 91, "train", tool_share=0.6, small_talk=0.1)
    talk = [s for s in samples if s.get("small_talk")]
    tool = [s for s in samples if s.get("tools")]
    # a tenth of the tool samples that were not already a question no tool fits (8%)
    assert 0.07 < len(talk) / len(tool) < 0.12, (len(talk), len(tool))
    replies = {talk_key(p): set(rs) for ps, rs in pools.SMALL_TALK for p in ps}
    for s in talk:
        assert s["kind"] == "tool_none" and s["tools"]
        user, reply = (m for m in s["messages"] if m["role"] != "system")
        assert user["role"] == "user" and reply == {
            "role": "assistant",
            "content": reply["content"],
        }
        assert reply["content"] in replies[talk_key(user["content"])], user
    assert len({m["content"] for s in talk for m in s["messages"] if m["role"] == "user"}) > 60
    # off, the generator draws what it always drew; a share outside [0, 1] is refused
    assert [dumps(s) for s in generate(200, 1234, "train")] == [
        dumps(s) for s in generate(200, 1234, "train", small_talk=0.0)
    ]
    with pytest.raises(ValueError, match="small_talk must be in"):
        generate(1, 1, "train", small_talk=-0.1)


def test_held_out_small_talk_shares_no_phrase_with_training() -> None:
    trained = {talk_key(p) for ps, _ in pools.SMALL_TALK for p in ps}
    trained |= {talk_key(q) for q, _ in GREETINGS}
    held = {talk_key(p) for ps, _ in pools.HELDOUT_SMALL_TALK for p in ps}
    assert held and not held & trained, held & trained
    ev = generate_eval(1235, 60, request_order=True)
    items = ev["tool_none"]
    assert len(items) == 60
    talk = [s for s in items if s.get("small_talk")]
    assert 30 < len(talk) < 60  # the rest: simple questions no tool fits
    for s in items:
        assert s["prompt_messages"][-1]["role"] == "user" and s["tools"] and s["expected_text"]
        assert "expected" not in s
    for s in talk:
        assert talk_key(s["prompt_messages"][-1]["content"]) in held


def test_small_talk_flag_writes_small_talk(tmp_path, monkeypatch) -> None:
    from training import generate_data

    argv = ["generate_data", "--out", str(tmp_path), "--num-train", "300", "--num-eval", "2"]
    monkeypatch.setattr("sys.argv", [*argv, "--tool-share", "1.0", "--small-talk", "0.5"])
    generate_data.main()
    lines = (tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines()
    talk = sum(bool(json.loads(line).get("small_talk")) for line in lines)
    assert 100 < talk < 180, talk  # half of the 92% that were not simple questions
    assert len(json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))["tool_none"]) == 2


def test_chatty_requests_wrap_a_request_in_small_talk_and_still_call() -> None:
    opens = {
        talk_key(p)
        for (ps, _), role in zip(pools.SMALL_TALK, pools.TALK_ROLES)
        for p in ps
        if role == "opens"
    }
    closes = {
        talk_key(p)
        for (ps, _), role in zip(pools.SMALL_TALK, pools.TALK_ROLES)
        for p in ps
        if role == "closes"
    }
    assert "hi" in opens and "ok" in opens and "thanks" in closes and "bye" in closes
    assert not opens & closes and "who are you" not in opens | closes
    samples = generate(3000, 92, "train", tool_share=0.6, chatty_requests=0.3)
    calls = [s for s in samples if s["kind"] in ("tool_call", "tool_loop")]
    chatty = [s for s in calls if s.get("chatty")]
    assert 0.25 < len(chatty) / len(calls) < 0.35, (len(chatty), len(calls))
    plain = generate(3000, 92, "train", tool_share=0.6)
    wrapped = before = 0
    for s in chatty:
        assert s["kind"] in ("tool_call", "tool_loop") and s["messages"][-1]["role"] == "assistant"
        user = next(m["content"] for m in s["messages"] if m["role"] == "user")
        calls_made = next(m for m in s["messages"] if m.get("tool_calls"))["tool_calls"]
        assert [c["function"]["name"] for c in calls_made] == [e["name"] for e in s["expected"]]
        first, last = re.split(r"[!.,?] ", user, maxsplit=1)[0], re.split(r"[.?!] ", user)[-1]
        if talk_key(first) in opens:
            before += 1
        else:
            assert talk_key(last) in closes, user
        wrapped += 1
    assert 0.35 < before / wrapped < 0.65
    # off, the generator draws what it always drew; a share outside [0, 1] is refused
    assert [dumps(s) for s in plain] == [
        dumps(s) for s in generate(3000, 92, "train", tool_share=0.6, chatty_requests=0.0)
    ]
    with pytest.raises(ValueError, match="chatty_requests must be in"):
        generate(1, 1, "train", chatty_requests=1.5)


def test_held_out_chatty_requests_take_held_out_small_talk() -> None:
    held = {talk_key(p) for ps, _ in pools.HELDOUT_SMALL_TALK for p in ps}
    trained = {talk_key(p) for ps, _ in pools.SMALL_TALK for p in ps}
    assert len(pools.HELDOUT_TALK_ROLES) == len(pools.HELDOUT_SMALL_TALK)
    assert len(pools.TALK_ROLES) == len(pools.SMALL_TALK)
    samples = generate(1500, 93, "eval", tool_share=1.0, chatty_requests=1.0)
    users = [
        next(m["content"] for m in s["messages"] if m["role"] == "user")
        for s in samples
        if s.get("chatty")
    ]
    assert len(users) > 1000
    ev = generate_eval(1235, 30, request_order=True)["tool_call_chatty"]
    assert len(ev) == 30 and all(s["prompt_messages"][-1]["role"] == "user" for s in ev)
    users += [s["prompt_messages"][-1]["content"] for s in ev]
    for user in users:
        ends = {
            talk_key(re.split(r"[!.,?] ", user, maxsplit=1)[0]),
            talk_key(re.split(r"[.?!] ", user)[-1]),
        }
        assert ends & held and not ends & trained, user


def test_place_readers_ask_about_a_place_and_call_with_it() -> None:
    opts = dict(tool_share=1.0, questions=1.0, readers=1.0, request_order=True)
    places = set(pools.PLACES) | {capital for _, capital in pools.COUNTRIES_CAPITALS}

    def place_calls(samples: list[dict]) -> list[str]:
        """The requests of one call whose one argument is a place-named one holding a place."""
        return [
            next(m["content"] for m in s["messages"] if m["role"] == "user")
            for s in samples
            if s["kind"] in ("tool_call", "tool_loop")
            and len(s["expected"]) == 1
            and len(args := s["expected"][0]["arguments"]) == 1
            and next(iter(args)) in pools.PLACE_ARG_NAMES
            and next(iter(args.values())) in places
        ]

    calls = sum(
        s["kind"] in ("tool_call", "tool_loop") for s in generate(1500, 94, "train", **opts)
    )
    with_places = place_calls(generate(1500, 94, "train", place_readers=0.5, **opts))
    without = place_calls(generate(1500, 94, "train", **opts))
    assert len(without) < 0.02 * calls and 0.2 * calls < len(with_places) < 0.5 * calls
    assert sum(q.startswith("What is the ") and q.endswith("?") for q in with_places) > 20
    # held-out sets never get them; off, the generator draws what it always drew
    held = generate(300, 94, "eval", place_readers=1.0, **opts)
    assert [dumps(s) for s in held] == [dumps(s) for s in generate(300, 94, "eval", **opts)]
    assert [dumps(s) for s in generate(300, 95, "train", **opts)] == [
        dumps(s) for s in generate(300, 95, "train", place_readers=0.0, **opts)
    ]
