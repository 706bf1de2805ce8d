"""The official JSON Schema test suite (draft 2020-12) through compile + matcher, token by token."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from brisklm.constrained import (
    CompiledGrammar,
    ConstraintError,
    Grammar,
    GrammarCompiler,
    JsonSchema,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SUITE_DIR = DATA_DIR / "json-schema-test-suite" / "tests" / "draft2020-12"

# Files whose schemas all need documents from the suite's remotes/ (not carried: no network).
SKIPPED_FILES = {
    "refRemote.json": "remote $ref to http://localhost:1234/...",
    "vocabulary.json": "remote custom metaschemas ($schema http://localhost:1234/...)",
    "optional/format-assertion.json": "remote custom metaschemas ($schema http://localhost:1234/...)",
    "optional/cross-draft.json": "remote $ref to draft 2019-09 / draft-07 documents",
}

# Every instance a compiled schema rejects although the suite calls it valid, and why.
_FLOAT_INTEGER = "decimal text: 1.0 / 0.0 / -2.0 is not an integer token sequence"
_FORMAT_ASSERTED = "format is enforced (assertion), the core suite treats it as an annotation"
_LEAP_SECOND = "no leap seconds (Python's datetime and time, and Pydantic's, refuse a second of 60)"
_PUNYCODE = "hostname labels with -- at positions 3-4 (IDN A-labels) are refused"
_ORDER = "object properties must follow the schema's `properties` order"
KNOWN_FALSE_REJECTS: dict[tuple[str, str], str] = {
    ("allOf.json", '{"foo": "baz", "bar": 2}'): _ORDER,
    ("allOf.json", '{"foo": "quux", "bar": 2, "baz": null}'): _ORDER,
    ("const.json", '{"baz": "bax", "foo": "bar"}'): _ORDER,
    ("const.json", "0.0"): _FLOAT_INTEGER,
    ("const.json", "1.0"): _FLOAT_INTEGER,
    ("const.json", "-2.0"): _FLOAT_INTEGER,
    ("const.json", "9007199254740992.0"): _FLOAT_INTEGER,
    ("enum.json", "0.0"): _FLOAT_INTEGER,
    ("enum.json", "[0.0]"): _FLOAT_INTEGER,
    ("enum.json", "1.0"): _FLOAT_INTEGER,
    ("enum.json", "[1.0]"): _FLOAT_INTEGER,
    ("type.json", "1.0"): _FLOAT_INTEGER,
    ("format.json", '"2962"'): _FORMAT_ASSERTED,
    ("format.json", '"127.0.0.0.1"'): _FORMAT_ASSERTED,
    ("format.json", '"12345::"'): _FORMAT_ASSERTED,
    ("format.json", '"-a-host-name-that-starts-with--"'): _FORMAT_ASSERTED,
    ("format.json", '"06/19/1963"'): _FORMAT_ASSERTED,
    ("format.json", '"1990-02-31T15:59:60.123-08:00"'): _FORMAT_ASSERTED,
    ("format.json", '"08:30:06 PST"'): _FORMAT_ASSERTED,
    ("format.json", '"//foo.bar/?baz=qux#quux"'): _FORMAT_ASSERTED,
    ("format.json", '"2eb8aa08-aa98-11ea-b4aa-73b441d1638"'): _FORMAT_ASSERTED,
    ("format.json", '"PT1D"'): _FORMAT_ASSERTED,
    (
        "optional/float-overflow.json",
        "1e+308",
    ): "exponent notation is refused where numeric bounds apply",
    ("optional/format/time.json", '"01:29:60+01:30"'): _LEAP_SECOND,
    ("optional/format/time.json", '"23:29:60+23:30"'): _LEAP_SECOND,
    ("optional/format/time.json", '"15:59:60-08:00"'): _LEAP_SECOND,
    ("optional/format/time.json", '"00:29:60-23:30"'): _LEAP_SECOND,
    ("optional/format/date-time.json", '"1998-12-31T15:59:60.123-08:00"'): _LEAP_SECOND,
    ("optional/format/date-time.json", '"1998-12-31T23:59:60Z"'): _LEAP_SECOND,
    ("optional/format/time.json", '"23:59:60Z"'): _LEAP_SECOND,
    ("optional/format/time.json", '"23:59:60+00:00"'): _LEAP_SECOND,
    (
        "optional/format/email.json",
        '"\\"joe bloggs\\"@example.com"',
    ): "quoted local parts unsupported",
    (
        "optional/format/email.json",
        '"\\"joe..bloggs\\"@example.com"',
    ): "quoted local parts unsupported",
    (
        "optional/format/email.json",
        '"\\"joe@bloggs\\"@example.com"',
    ): "quoted local parts unsupported",
    ("optional/format/email.json", '"joe.bloggs@[IPv6:::1]"'): "IPv6 address literals unsupported",
    ("optional/format/duration.json", '"P' + "9" * 78 + 'D"'): (
        "numbers bounded to what Pydantic's timedelta reads"
    ),
    ("optional/format/email.json", '"joe.bloggs@[127.0.0.1]"'): (
        "address literals unsupported (Pydantic's EmailStr refuses them)"
    ),
    ("optional/format/ipv6.json", '"1::d6:192.168.0.1"'): "IPv6 with embedded IPv4 unsupported",
    ("optional/format/ipv6.json", '"1:2::192.168.0.1"'): "IPv6 with embedded IPv4 unsupported",
    ("optional/format/ipv6.json", '"::ffff:192.168.0.1"'): "IPv6 with embedded IPv4 unsupported",
    ("optional/format/ipv6.json", '"1000:1000:1000:1000:1000:1000:255.255.255.255"'): (
        "IPv6 with embedded IPv4 unsupported"
    ),
    **{
        ("optional/format/hostname.json", f'"{h}"'): _PUNYCODE
        for h in [
            "xn--9n2bp8q.xn--9t4b11yi5a",
            "xn--zca29lwxobi7a",
            "xn--qmbc",
            "xn--ll-0ea",
            "xn--wva3je",
            "xn--4dbc5h",
            "xn--4dbc8h",
            "xn--k8j5u",
            "xn--bck0j",
            "xn--vek778f",
            "xn--ngba1o",
            "xn--0-gyc",
            "xn--11b2ezcw70k",
            "xn--11b2ezcs70k",
            "xn--ngba5hb2804a",
        ]
    },
}


def _instance_text(data: object) -> str:
    # The whitespace style the compiled grammars accept: json.dumps spacing on one line, raw UTF-8.
    return json.dumps(data, ensure_ascii=False)


def _accepts(
    compiler: GrammarCompiler, compiled: CompiledGrammar, tokenizer: Any, text: str
) -> bool:
    matcher = compiled.matcher()
    ids = tokenizer.encode(text)
    return all(matcher.accept_token(t) for t in ids) and matcher.accept_token(
        compiler.eos_token_ids[0]
    )


def test_json_schema_test_suite(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    files = sorted(SUITE_DIR.rglob("*.json"))
    assert len(files) > 60, "test data missing: tests/data/json-schema-test-suite"
    counts: Counter[str] = Counter()
    by_section: dict[str, Counter[str]] = {s: Counter() for s in ("core", "optional", "format")}
    not_compiled: Counter[str] = Counter()
    false_accepts: list[tuple[str, str, str]] = []
    false_rejects: list[tuple[str, str, str]] = []
    for path in files:
        name = path.relative_to(SUITE_DIR).as_posix()
        if name.startswith("optional/format/"):
            tally = by_section["format"]
        else:
            tally = by_section["optional" if name.startswith("optional/") else "core"]
        if name in SKIPPED_FILES:
            tally["skipped files"] += 1
            continue
        for case in json.loads(path.read_text(encoding="utf-8")):
            try:
                compiled = bpe_compiler.compile(JsonSchema(case["schema"], strict=False))
            except ConstraintError as e:
                assert str(e), "a compile error must say why"
                tally["not compiled"] += 1
                not_compiled[str(e).splitlines()[0][:90]] += 1
                continue
            tally["compiled"] += 1
            for test in case["tests"]:
                text = _instance_text(test["data"])
                accepted = _accepts(bpe_compiler, compiled, bpe_tokenizer, text)
                where = (name, case["description"], text)
                if test["valid"]:
                    tally["valid accepted" if accepted else "false rejects"] += 1
                    if not accepted:
                        false_rejects.append(where)
                else:
                    tally["invalid rejected" if not accepted else "false accepts"] += 1
                    if accepted:
                        false_accepts.append(where)
    for tally in by_section.values():
        counts.update(tally)
    with capsys.disabled():
        print("\nJSON Schema test suite, draft 2020-12 (format: optional/format, asserted)")
        print(f"  {'':>16}  {'core':>6} {'optional':>8} {'format':>6} {'total':>6}")
        for key in [
            "compiled",
            "not compiled",
            "valid accepted",
            "invalid rejected",
            "false accepts",
            "false rejects",
            "skipped files",
        ]:
            row = " ".join(
                f"{by_section[s][key]:>{w}}"
                for s, w in (("core", 6), ("optional", 8), ("format", 6))
            )
            print(f"  {key:>16}: {row} {counts[key]:>6}")
        print("  not compiled, most common reasons:")
        for reason, n in not_compiled.most_common(8):
            print(f"    {n:4d}  {reason}")
        print(f"    ({len(not_compiled) - min(8, len(not_compiled))} more distinct reasons)")
    assert not false_accepts, f"grammar accepted invalid instances: {false_accepts}"
    unexplained = [r for r in false_rejects if (r[0], r[2]) not in KNOWN_FALSE_REJECTS]
    assert not unexplained, f"unexplained false rejects: {unexplained}"
    assert counts["compiled"] >= 200 and counts["valid accepted"] >= 550, counts
    assert counts["skipped files"] == len(SKIPPED_FILES)


def _soundness_against_the_open_schema(
    compiler: GrammarCompiler, tokenizer: Any, constraint: Callable[[Any], Any]
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]], int]:
    """The suite's invalid instances that ``constraint(schema)`` accepts, the cases it refuses
    where ``JsonSchema(schema, strict=False)`` compiles, and how many cases it compiled."""
    false_accepts = []
    lost = []
    num_compiled = 0
    for path in sorted(SUITE_DIR.rglob("*.json")):
        name = path.relative_to(SUITE_DIR).as_posix()
        if name in SKIPPED_FILES:
            continue
        for case in json.loads(path.read_text(encoding="utf-8")):
            try:
                compiled = compiler.compile(constraint(case["schema"]))
            except ConstraintError:
                try:
                    compiler.compile(JsonSchema(case["schema"], strict=False))
                except ConstraintError:
                    continue
                lost.append((name, case["description"]))
                continue
            num_compiled += 1
            for test in case["tests"]:
                text = _instance_text(test["data"])
                if not test["valid"] and _accepts(compiler, compiled, tokenizer, text):
                    false_accepts.append((name, case["description"], text))
    return false_accepts, lost, num_compiled


def test_strict_mode_accepts_no_invalid_instance(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any
) -> None:
    """Strict mode closes objects; it may reject more valid instances, never accept an invalid
    one, and it compiles what the open mode compiles (closing must not make a schema
    unsatisfiable or refused)."""
    false_accepts, lost, num_compiled = _soundness_against_the_open_schema(
        bpe_compiler, bpe_tokenizer, lambda schema: JsonSchema(schema, strict=True)
    )
    assert not false_accepts, f"strict grammars accepted invalid instances: {false_accepts}"
    assert not lost, f"compiled only without strict: {lost}"
    assert num_compiled >= 200


def test_lark_json_embeds_accept_no_invalid_instance(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any
) -> None:
    """A Lark grammar's `%json` embed is enforced as a json_schema constraint is: the suite's
    schemas embedded in a grammar accept no invalid instance either (llguidance alone took
    escaped keys, over-approximated formats and read ECMA patterns as Rust ones), and compile
    where the constraint compiles."""
    false_accepts, lost, num_compiled = _soundness_against_the_open_schema(
        bpe_compiler,
        bpe_tokenizer,
        lambda schema: Grammar("start: %json " + json.dumps(schema, ensure_ascii=False)),
    )
    assert not false_accepts, f"%json embeds accepted invalid instances: {false_accepts}"
    assert not lost, f"compiled as json_schema only: {lost}"
    assert num_compiled >= 200


def test_suite_remote_files_are_the_only_skips() -> None:
    for name in SKIPPED_FILES:
        assert (SUITE_DIR / name).is_file(), name
        assert "localhost:1234" in (SUITE_DIR / name).read_text(encoding="utf-8")
    assert (DATA_DIR / "json-schema-test-suite" / "LICENSE").is_file()


def test_known_false_rejects_are_real(bpe_compiler: GrammarCompiler, bpe_tokenizer: Any) -> None:
    """Each named false reject is a valid instance in the suite; listing one that is not is a typo."""
    listed = set(KNOWN_FALSE_REJECTS)
    found = set()
    for name, _ in listed:
        for case in json.loads((SUITE_DIR / name).read_text(encoding="utf-8")):
            for test in case["tests"]:
                key = (name, _instance_text(test["data"]))
                if key in listed and test["valid"]:
                    found.add(key)
    assert found == listed, listed - found
