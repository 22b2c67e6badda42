r"""User strings (target flags, names, descriptions) written into the build files of a project folder.

One function per syntax; each gives back, after that syntax's parsing, exactly the string it was given:
  cmake_quoted   a CMake quoted argument: "..." with \\ \" \$ \n \r \t escaped
  cmake_list     list elements, each quoted; an element cannot hold `;` (CMake's list separator): ValueError
  make_shell     one word of a Make recipe run by sh: quoted for sh, then `$` doubled and `#` escaped for Make
  cmake_comment / text_line   a string on one line of a comment or of prose (line breaks become spaces)
"""

from __future__ import annotations

import shlex

_CMAKE = {"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cmake_quoted(text: str) -> str:
    """`text` as a CMake quoted argument (one list element, even with `;` in it)."""
    return '"' + "".join(_CMAKE.get(c, c) for c in str(text)) + '"'


def cmake_list(items) -> str:
    bad = [i for i in items if ";" in str(i)]
    if bad:
        raise ValueError(f"{bad[0]!r}: a `;` cannot be part of one CMake list element (a flag)")
    return " ".join(cmake_quoted(i) for i in items)


def make_shell(text: str) -> str:
    """`text` as one shell word in a Makefile variable or recipe: Make leaves sh exactly shlex.quote(text)."""
    text = str(text)
    if "\n" in text or "\r" in text or "\0" in text:
        raise ValueError(f"{text!r}: a line break or NUL cannot be a word of a Makefile")
    return shlex.quote(text).replace("$", "$$").replace("#", "\\#")


def make_words(items) -> str:
    return " ".join(make_shell(i) for i in items)


def text_line(text: str) -> str:
    """A string for one line of prose or of a comment: line breaks and other control characters as spaces."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(text))
