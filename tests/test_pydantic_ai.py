"""pydantic-ai's `Agent` against `sprinter-edge serve` on the default pair (Qwen2.5-Coder
0.5B -> 1.5B): a typed output through pydantic-ai's own tool-output mode (a forced call of its
`final_result` tool) and through `NativeOutput` (response_format json_schema). The constraint,
not the model, makes the output validate. Bounded: greedy, short prompts, at most 64 tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from support.server import running_server

pytestmark = pytest.mark.integration

SETTINGS = ModelSettings(max_tokens=64, temperature=0.0)
PROMPT = "Paris is the capital of France and has about 2 million inhabitants."


class City(BaseModel):
    name: str = Field(max_length=32)
    country: str = Field(max_length=32)
    population_millions: float = Field(ge=0, le=100)


@pytest.fixture(scope="module")
def model(default_pair_paths: tuple[Path, Path], tmp_path_factory) -> Iterator[OpenAIChatModel]:  # noqa: ANN001
    draft, target = default_pair_paths
    args = ["--target", str(target), "--draft", str(draft), "--method", "sd", "--verifier",
            "confidence", "--threads", "2", "--ctx", "2048", "--max-tokens", "64",
            "--model-name", "default"]
    with running_server(args, tmp_path_factory.mktemp("serve-pydantic-ai") / "server.log") as base:
        yield OpenAIChatModel("default", provider=OpenAIProvider(base_url=f"{base}/v1",
                                                                 api_key="unused"))


def check(city: City) -> None:
    assert isinstance(city, City)
    assert "paris" in city.name.lower() and "france" in city.country.lower(), city
    assert 0 <= city.population_millions <= 100


@pytest.mark.parametrize("output", [City, NativeOutput(City)], ids=["tool", "native"])
def test_agent_typed_output(model: OpenAIChatModel, output) -> None:  # noqa: ANN001
    agent = Agent(model, output_type=output, model_settings=SETTINGS, retries=0,
                  instructions="Extract the city described by the user.")
    result = agent.run_sync(PROMPT)
    check(result.output)
    usage = result.usage
    print(f"\n{output}: {result.output!r}, {usage.input_tokens} in, {usage.output_tokens} out")
