"""An agent loop with two tools: the model calls a tool, we run it and send back a ToolMessage,
and the model answers. Tool names and arguments are always valid: they are decoded under a grammar
built from the tools' schemas.

    python examples/agent_tools.py [--model CHECKPOINT_DIR] [--device cpu|cuda] [QUESTION]

The bundled 11M model reads a request by its phrasing as much as by its meaning: "What is the
weather in Paris?" and "Get the weather for Paris." call get_weather and "Convert 30 degrees
Celsius to Fahrenheit." celsius_to_fahrenheit with 30, but "How is the weather in Oslo?" and "Is
it raining in Tokyo?" call celsius_to_fahrenheit with a made-up value (its held-out tool-name
accuracy is 95-97%; training/README.md).
"""

from __future__ import annotations

import json
import math
import sys

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from brisklm.command import CommandParser, run_command
from langchain_brisklm import ChatBrisk

WEATHER = {
    "paris": {"condition": "sunny", "temperature_c": 24},
    "tokyo": {"condition": "rainy", "temperature_c": 18},
    "oslo": {"condition": "snowy", "temperature_c": -3},
}


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    report = WEATHER.get(city.strip().lower(), {"condition": "unknown", "temperature_c": 15})
    return json.dumps({"city": city, **report})


@tool
def celsius_to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit."""
    fahrenheit = celsius * 9 / 5 + 32
    if not math.isfinite(fahrenheit):  # (JSON has no Infinity)
        return json.dumps({"error": f"{celsius} degrees Celsius is out of range"})
    return json.dumps({"fahrenheit": round(fahrenheit, 1)})


TOOLS = {t.name: t for t in (get_weather, celsius_to_fahrenheit)}
MAX_ROUNDS = 4


def run_agent(chat: ChatBrisk, question: str) -> list[BaseMessage]:
    """Ask, run the tools the model calls, feed their results back, until the model answers
    (or MAX_ROUNDS replies have called tools: the last message is then a tool result)."""
    model = chat.bind_tools(list(TOOLS.values()))  # tool_choice="auto": the model decides
    messages: list[BaseMessage] = [HumanMessage(question)]
    for _ in range(MAX_ROUNDS):
        reply = model.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            print(f"tool call: {call['name']}({json.dumps(call['args'])})")
            result = TOOLS[call["name"]].invoke(call)  # a ToolMessage answering the call
            assert isinstance(result, ToolMessage)
            print(f"tool result: {result.content}")
            messages.append(result)
    return messages


def main() -> None:
    parser = CommandParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("question", nargs="?", default="Please get the weather for Paris.")
    parser.add_argument(
        "--model", help="checkpoint directory (default: $BRISKLM_MODEL, else the bundled model)"
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], help="where to run (default: cuda if available)"
    )
    args = parser.parse_args()

    chat = ChatBrisk(model=args.model, device=args.device, temperature=0, max_tokens=160)
    print(f"user: {args.question}")
    last = run_agent(chat, args.question)[-1]
    if isinstance(last, AIMessage) and not last.tool_calls:
        print(f"assistant: {last.text}")
    else:
        print(f"assistant: (no answer after {MAX_ROUNDS} rounds of tool calls)")


if __name__ == "__main__":
    # Errors as one line (a missing checkpoint, a question too long), Ctrl-C and `| head` quietly.
    sys.exit(run_command(main, "agent_tools.py"))
