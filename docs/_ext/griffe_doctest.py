"""A griffe extension for the API pages: render docstrings' bare doctest blocks as code.

jaxfn's docstrings put their doctest examples (``>>>`` lines and the output after them) in the
text, not under an ``Examples:`` heading, so the Google-style parser hands them to Markdown as
prose, where output such as ``[2. 2.]`` reads as a cross-reference. This wraps each block (from
its first ``>>>`` line to the next blank line) in a fenced ``pycon`` code block. The docstrings
themselves are unchanged.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
