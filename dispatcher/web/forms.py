"""Reading a submitted form: size-capped, URL-encoded UTF-8, fields checked by name.

A malformed form is a :class:`~dispatcher.web.errors.FormError` naming the field (HTTP 400);
nothing is changed before every field has been read.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request

from dispatcher.web.errors import FormError

MAX_FORM_BYTES = 1024 * 1024
"""A card body may be long; anything beyond this is refused, not truncated."""
MAX_FIELDS = 64


class Form:
    """The fields of one submitted form (the last value of a repeated name wins; every value
    of a repeated name, such as a list of ticked boxes, is :meth:`values`)."""

    def __init__(self, fields: dict[str, str], pairs: list[tuple[str, str]] | None = None):
        self.fields = fields
        self.pairs = list(fields.items()) if pairs is None else pairs

    def values(self, name: str) -> list[str]:
        """Every value sent under ``name``, in order."""
        return [value for key, value in self.pairs if key == name]

    def get(self, name: str, default: str | None = None) -> str | None:
        """The raw value, or ``default`` when absent."""
        return self.fields.get(name, default)

    def text(self, name: str, *, required: bool = False) -> str | None:
        """A text field (None when absent or, unless required, empty)."""
        value = self.fields.get(name)
        if value is None or value == "":
            if required:
                raise FormError(name, "is required")
            return None
        return value

    def integer(self, name: str, *, default: int | None = None) -> int | None:
        """A whole-number field (``default`` when absent or empty)."""
        value = (self.fields.get(name) or "").strip()
        if not value:
            return default
        try:
            return int(value, 10)
        except ValueError:
            raise FormError(name, f"must be a whole number, not {value[:40]!r}") from None

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """A field that must be one of ``choices``."""
        value = self.fields.get(name)
        if value not in choices:
            raise FormError(name, f"must be one of {', '.join(choices)}")
        return value

    @property
    def confirmed(self) -> bool:
        """The operator confirmed a destructive action (``confirm=yes``)."""
        return self.fields.get("confirm") == "yes"


async def read_form(request: Request, *, max_fields: int = MAX_FIELDS) -> Form:
    """The request's form (400 for a body that is too large, not URL-encoded or not UTF-8, or
    with more than ``max_fields`` fields)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormError("(body)", f"larger than {MAX_FORM_BYTES // 1024} KiB")
    if kind != "application/x-www-form-urlencoded" and (body or kind):
        # An empty POST (a script's button press) has no fields and needs no type.
        raise FormError("(body)", "send the form as application/x-www-form-urlencoded")
    try:
        text = bytes(body).decode("utf-8")
        pairs = urllib.parse.parse_qsl(
            text, keep_blank_values=True, max_num_fields=max_fields, errors="strict"
        )
    except UnicodeDecodeError:
        raise FormError("(body)", "not valid UTF-8") from None
    except ValueError as err:
        raise FormError("(body)", str(err)) from None
    return Form(dict(pairs), pairs)
