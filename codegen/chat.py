"""Chat templates reduced to a prefix and a suffix, so a device needs no template engine.

tokenizer_config.json's `chat_template` (jinja2) is rendered in a sandbox
(jinja2.sandbox.ImmutableSandboxedEnvironment, with transformers' apply_chat_template settings:
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now, the special
tokens of tokenizer_config.json as variables) for one user turn with add_generation_prompt=True.
The user text is a sentinel; the rendering is split around it into prefix + suffix, and a chat on
the device is prefix + user text + suffix. The text is inserted verbatim: a template's own filters
on the content (e.g. `| trim`) are not applied to it.

Refused, with one line: a template that does not render, whose sentinel is absent or appears more
than once, or whose prefix/suffix change with the text (checked by rendering a second sentinel).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

SENTINELS = ("\u2063colibri-user-text-A\u2063", "\u2063colibri-user-text-B, longer\u2063")  # lengths differ too


class ChatTemplateError(ValueError):
    """A chat template that cannot be reduced to prefix + suffix: the message is one line."""


@dataclass(frozen=True)
class ChatParts:
    prefix: str
    suffix: str

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "suffix": self.suffix}


def _environment():
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(config: dict) -> dict[str, str]:
    """bos_token, eos_token, ... of tokenizer_config.json: strings, or AddedToken dicts' content."""
    out = {}
    for key, value in config.items():
        if key.endswith("_token"):
            if isinstance(value, dict) and isinstance(value.get("content"), str):
                out[key] = value["content"]
            elif isinstance(value, str):
                out[key] = value
    return out


def template_text(config: dict) -> str | None:
    """The chat template of a tokenizer_config.json: a string, or the "default" one of a named list."""
    tmpl = config.get("chat_template")
    if tmpl is None or isinstance(tmpl, str):
        return tmpl
    if isinstance(tmpl, list):
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ChatTemplateError("chat_template is neither a string nor a list with a \"default\" template")


def _render(template: Any, text: str, variables: dict) -> str:
    return template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True, tools=None,
                           documents=None, **variables)


def reduce_template(template_src: str, variables: dict[str, str]) -> ChatParts:
    """prefix + suffix of the template for one user turn; ChatTemplateError if it cannot be reduced."""
    from jinja2.exceptions import TemplateError

    try:
        template = _environment().from_string(template_src)
        renders = [_render(template, s, variables) for s in SENTINELS]
    except TemplateError as e:
        raise ChatTemplateError(f"chat_template does not render for one user turn: {e}") from None
    parts = []
    for sentinel, rendered in zip(SENTINELS, renders, strict=True):
        n = rendered.count(sentinel)
        if n != 1:
            where = "does not contain" if n == 0 else f"contains {n} times"
            raise ChatTemplateError(f"chat_template rendered for one user turn {where} the user text; "
                                    "it cannot be reduced to prefix + text + suffix")
        prefix, suffix = rendered.split(sentinel)
        parts.append(ChatParts(prefix, suffix))
    if parts[0] != parts[1]:
        raise ChatTemplateError("chat_template's prefix or suffix depends on the user text; "
                                "it cannot be reduced to prefix + text + suffix")
    return parts[0]


def chat_parts(ckpt_dir: Path) -> ChatParts | None:
    """The checkpoint's chat prefix/suffix, None when it has no tokenizer_config.json or no chat_template.
    Raises ChatTemplateError (the message without the file name), ExportError for an unreadable file."""
    from .safeio import read_json

    path = Path(ckpt_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    config = read_json(path, "tokenizer config")
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    src = template_text(config)
    return None if src is None else reduce_template(src, special_tokens(config))
