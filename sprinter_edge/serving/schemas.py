"""Request bodies of the OpenAI-compatible endpoints (pydantic; unknown fields are refused).

The standard OpenAI fields that sprinter-edge cannot honour are accepted only at their
neutral values, so a client that sends them explicitly still works; `method`, `threshold`
and `top_k` are sprinter-edge extensions; `model` may be any name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..decoding import METHODS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerationFields(_Strict):
    model: str | None = None  # any name: the server serves its one loaded pair
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, description="only one choice is generated")
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported")
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported")
    user: str | None = None
    # sprinter-edge extensions
    method: str | None = Field(default=None, description=f"one of {', '.join(METHODS)}")
    threshold: float | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str | None) -> str | None:
        if value is not None and value not in METHODS:
            raise ValueError(f"unknown method {value!r}; choose from {', '.join(METHODS)}")
        return value

    @model_validator(mode="after")
    def _check_stop(self) -> _GenerationFields:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 sequences")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] | list[int]
    echo: bool = Field(default=False, description="not supported (must be false)")
    logprobs: None = None
    suffix: None = None

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(self.prompt[0], str) and len(self.prompt) != 1:
                raise ValueError("one prompt per request (a list of one string)")
        return self

    def prompt_value(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return self.prompt  # type: ignore[return-value]

    def token_limit(self) -> int | None:
        return self.max_tokens
