"""Constrained decoding on llguidance: compile (cached per tokenizer), match (per request), apply."""

from brisklm.constrained.apply import apply_token_bitmask_, apply_token_bitmask_reference
from brisklm.constrained.compiler import CompiledGrammar, GrammarCompiler
from brisklm.constrained.errors import ConstraintError
from brisklm.constrained.json_schema import JSON_OPTIONS, ecma_regex_to_rust
from brisklm.constrained.matcher import GrammarMatcher, allocate_token_bitmask, fill_bitmasks
from brisklm.constrained.spec import (
    AfterThinking,
    Choice,
    Constraint,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
    constraint_from_options,
)
from brisklm.constrained.tokenizer_bridge import TokenizerLike, llg_tokenizer_for

__all__ = [
    "JSON_OPTIONS",
    "AfterThinking",
    "Choice",
    "CompiledGrammar",
    "Constraint",
    "ConstraintError",
    "Grammar",
    "GrammarCompiler",
    "GrammarMatcher",
    "JsonObject",
    "JsonSchema",
    "Regex",
    "TokenizerLike",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "apply_token_bitmask_reference",
    "constraint_from_options",
    "ecma_regex_to_rust",
    "fill_bitmasks",
    "llg_tokenizer_for",
]
