"""The OpenAI requests the worker takes, checked at the edge (the front end and ``send_request``).

Only what the worker itself relies on is checked (the model's name, the messages' shape, the prompt,
token counts, the stream flags); every other field (sampling parameters, vLLM's own extras such as
``return_token_ids``) is allowed and goes to the engine as sent, which checks it in turn. A request
that fails here is a 400 naming the field (``param``), never a 422 of the framework's own shape.
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.worker.errors import BadRequest


class InvalidRequest(BadRequest):
    """A 400 naming the request field at fault (OpenAI's ``param``) and a ``code`` where OpenAI has one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[ContentPart], None] = None


class StreamOptions(_Open):
    include_usage: bool | None = None


class _Generate(_Open):
    model: str = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)


class ChatRequest(_Generate):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


Prompt = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_Generate):
    prompt: Prompt


class EmbeddingRequest(_Open):
    model: str = Field(min_length=1)
    input: Prompt
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    truncate: bool | None = None  # TEI's name, taken on encoder endpoints (docs/embeddings.md)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param(loc: tuple[Any, ...]) -> str:
    """``messages.0.role`` from pydantic's location, without the union members' type tags."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or (str(p).isidentifier() and p not in _TYPE_TAGS))


def validated(schema: type[BaseModel], doc: Any) -> dict[str, Any]:
    """The request as sent, once it has the shape ``schema`` needs; an InvalidRequest naming the field if not."""
    if not isinstance(doc, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        schema.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"])
        raise InvalidRequest(f"{param or 'body'}: {first['msg']}", param=param or None) from None
    return doc
