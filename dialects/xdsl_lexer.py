"""A fix to xDSL 0.74's MLIR lexer, applied when the dialects are imported (every parser of
coconet's IR registers them first).

Its string-literal pattern nests a `+` run inside a `*` repetition, so a literal with no
closing quote (a truncated file, a pipeline attribute cut short) backtracks through every way
of splitting the run: `coco-opt` spun for minutes on a 32-character unterminated
`coco.schedule` string (found by the fuzzer) instead of reporting "End of file reached before
closing string literal". The same pattern with possessive quantifiers matches exactly the
same literals -- its two alternatives never start with the same character, so there is
nothing to backtrack into -- and fails at once."""

from __future__ import annotations

import re

from xdsl.utils.mlir_lexer import MLIRLexer

STRING_LITERAL = re.compile(r'"(?:[^"\\\n\v\f]++|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*+"')


def install() -> None:
    MLIRLexer._unescaped_characters_regex = STRING_LITERAL  # pyright: ignore[reportPrivateUsage]
