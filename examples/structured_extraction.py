"""Extract a pydantic model from each of a list of sentences with ChatBrisk, valid by construction.

Every reply is decoded under the model's JSON schema, so each result parses into a `Person`; the
sentences go to the engine together, as one batch. Valid is not right: the bundled 11M model
copies most fields from sentences phrased as its training data phrases them ("Lena Fischer is a
33-year-old architect living in Berlin." gives the name, age and city, though the occupation
"architect living") and misplaces them in others ("At 41, Grace Okafor teaches physics in Lagos."
gives the name "At 40"); its held-out field accuracy is in the README.

    python examples/structured_extraction.py [--model CHECKPOINT_DIR] [--device cpu|cuda]
"""

from __future__ import annotations

import json
import sys
import time

from langchain_core.prompts import ChatPromptTemplate
from pydantic import BaseModel, Field

from brisklm.command import CommandParser, run_command
from langchain_brisklm import ChatBrisk

SENTENCES = [
    "Ada Lovelace, 36, works as a mathematician in London.",
    "The chef Marco Rossi is 52 years old and runs a kitchen in Rome.",
    "Yuki Tanaka (29) is a pilot based in Osaka.",
    "At 41, Grace Okafor teaches physics in Lagos.",
    "Lena Fischer is a 33-year-old architect living in Berlin.",
]


class Person(BaseModel):
    """A person mentioned in a sentence."""

    name: str = Field(description="Full name", max_length=40)
    age: int = Field(description="Age in years", ge=0, le=130)
    occupation: str = Field(description="Job", max_length=30)
    city: str = Field(description="City they live or work in", max_length=30)


PROMPT = ChatPromptTemplate.from_messages(
    [("user", "Extract JSON matching this schema: {schema}\nText: {sentence}")]
)


def main() -> None:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", help="checkpoint directory (default: $BRISKLM_MODEL, else the bundled model)"
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], help="where to run (default: cuda if available)"
    )
    args = parser.parse_args()

    chat = ChatBrisk(model=args.model, device=args.device, temperature=0, max_tokens=128)
    extract = PROMPT | chat.with_structured_output(Person)
    schema = json.dumps(Person.model_json_schema())
    start = time.perf_counter()
    people = extract.batch([{"schema": schema, "sentence": s} for s in SENTENCES])
    elapsed = time.perf_counter() - start
    for sentence, person in zip(SENTENCES, people):
        assert isinstance(person, Person)
        print(f"{sentence}\n  -> {person.model_dump_json()}")
    print(f"{len(people)} people extracted in {elapsed:.2f}s")


if __name__ == "__main__":
    # Errors as one line (a missing checkpoint), Ctrl-C and `| head` quietly.
    sys.exit(run_command(main, "structured_extraction.py"))
