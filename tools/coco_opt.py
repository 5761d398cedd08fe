"""`coco-opt`: xDSL's optimizer driver with the coco/comm dialects, coconet's passes and its
targets registered. Errors end in one message and exit 1, never a Python traceback.

`coco-opt --list-passes` lists every pass, one line each (its options, then the first
sentence of its docstring): coconet's first (the schedule passes, then the lowering's
decisions), then xDSL's. `--help` lists coconet's.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import io
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import IO, Any

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    MultipleSpansParseError,
    ParseError,
    PassFailedException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from coconet.dialects import get_all_dialects
from coconet.lowering import get_all_passes as lowering_passes
from coconet.schedule import get_all_passes as schedule_passes


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """coconet's passes as coco-opt registers and lists them: the schedule passes, then the
    lowering's decisions (`coco-choose-topology`, `coco-defer`: lowering/decisions.py;
    `coco-segment`: lowering/segments.py)."""
    return {**schedule_passes(), **lowering_passes()}


class CocoOptMain(xDSLOptMain):
    version_format = "coco-opt built on xdsl {xdsl_version}"

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="coconet modular optimizer driver", args=args)

    def register_all_dialects(self) -> None:
        super().register_all_dialects()
        registered = set(self.ctx.registered_dialect_names)
        for name, factory in get_all_dialects().items():
            if name not in registered:
                self.ctx.register_dialect(name, factory)

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in get_all_passes().items():
            self.register_pass(name, factory)

    def register_all_frontends(self) -> None:
        super().register_all_frontends()
        self._line_offset = 0  # the line of the chunk being parsed (--split-input-file)
        self.available_frontends["mlir"] = lambda stream: LocatingParser(
            self.ctx, stream.read(), self.get_input_name(), self._line_offset
        ).parse_module(not self.args.no_implicit_module)
        # The input file's path, as coco-run takes it (the stream may be a copy of its bytes).
        self.available_frontends["py"] = lambda _stream: parse_python_program(self.args.input_file)

    def register_all_targets(self) -> None:
        super().register_all_targets()
        try:
            from coconet.lowering import get_all_targets
        except ImportError:
            return
        self.available_targets.update(get_all_targets())

    # -- --verify-equivalence: translation validation of the pipeline in the sim oracle ------

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        # xDSL's -p help names all ~140 passes in one comma-separated run: point at the listing
        # instead, and show coconet's own passes (one line each) below the options.
        for action in arg_parser._actions:
            if "--passes" in action.option_strings:
                action.help = (
                    "pass pipeline: comma-separated NAME or NAME{OPTION=VALUE ...} (coconet's "
                    "passes are listed below; --list-passes lists every pass with its options)"
                )
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.epilog = "coconet passes:\n" + "\n".join(
            pass_lines(get_all_passes(), indent="  ")
        )
        arg_parser.add_argument(
            "--list-passes",
            action="store_true",
            help="list every pass, one line each with its options and what it does: "
            "coconet's passes first, then xDSL's; then exit",
        )
        arg_parser.add_argument(
            "--remarks",
            action="store_true",
            help="print the passes' remarks on stderr, MLIR's way (FILE:LINE:COL: remark: "
            "...): what a greedy pass skipped, with the refusal its targeted form gives",
        )
        arg_parser.add_argument(
            "--verify-equivalence",
            action="store_true",
            help="run every function before and after the pipeline in the sim oracle on the "
            "same random inputs and fail (exit 1, with a report) if any output differs",
        )
        arg_parser.add_argument(
            "--equivalence-ranks",
            type=_rank_counts,
            default=(1, 2, 4),
            metavar="N,N,...",
            help="rank counts --verify-equivalence runs (default 1,2,4)",
        )
        arg_parser.add_argument(
            "--equivalence-seeds",
            type=_int_list,
            default=(0, 1),
            metavar="S,S,...",
            help="input seeds --verify-equivalence runs (default 0,1)",
        )
        arg_parser.add_argument(
            "--equivalence-tolerant",
            action="store_true",
            help="compare within per-dtype tolerances (coconet.core.tolerances.TOLERANCES) "
            "instead of bit-exactly",
        )

    def run(self) -> None:
        if self.args.list_passes:
            coco = get_all_passes()
            xdsl = {k: v for k, v in self.available_passes.items() if k not in coco}
            print("coconet passes (-p NAME or -p 'NAME{OPTION=VALUE ...}'):")
            print("\n".join(pass_lines(coco, indent="  ")))
            print(f"\nxDSL passes ({len(xdsl)}):")
            print("\n".join(pass_lines(xdsl, indent="  ")))
            return
        super().run()

    def apply_passes(self, prog: ModuleOp) -> None:
        if not self.args.verify_equivalence:
            self._run_pipeline(prog)
            return
        from coconet.equivalence import EquivalenceError, check_module_equivalence

        before = prog.clone()
        self._run_pipeline(prog)
        pipeline = self.args.passes or "(no passes)"
        try:
            reports = check_module_equivalence(
                before,
                prog,
                self.args.equivalence_ranks,
                self.args.equivalence_seeds,
                exact=not self.args.equivalence_tolerant,
            )
        except EquivalenceError:
            raise
        except Exception as e:
            raise EquivalenceError(
                f"--verify-equivalence: the sim cannot run the original program, so the "
                f"pipeline '{pipeline}' cannot be checked: {type(e).__name__}: {e}"
            ) from None
        failed = [r for r in reports if not r.ok]
        if failed:
            raise EquivalenceError(
                f"--verify-equivalence: the pipeline '{pipeline}' changed the meaning of "
                + ", ".join(f"@{r.function}" for r in failed)
                + "\n"
                + "\n".join(str(r) for r in failed)
            )
        unchecked = [r for r in reports if not r.checked]
        if unchecked:
            raise EquivalenceError(
                "--verify-equivalence compared nothing for "
                + ", ".join(f"@{r.function}" for r in unchecked)
                + f" at rank counts {','.join(map(str, self.args.equivalence_ranks))}\n"
                + "\n".join(str(r) for r in unchecked)
            )

    def _run_pipeline(self, prog: ModuleOp) -> None:
        """The pipeline; a refusal about an op (a pass's `fail(..., at=op)`) is reported at
        that op's location, `FILE:LINE:COL: [rule] message`, as MLIR reports a diagnostic: so
        `--split-input-file --verify-diagnostics` prints each chunk's refusal where a
        FileCheck line beside the op (`[[# @LINE + 1]]`) can pin it."""
        if not self.args.remarks:
            self._apply_located(prog)
            return
        from coconet.passes.common import collecting_remarks

        with collecting_remarks() as remarks:
            try:
                self._apply_located(prog)
            finally:
                for r in remarks:
                    where = refusal_location(r) or "coco-opt"
                    print(f"{where}: remark: {r}", file=sys.stderr)

    def _apply_located(self, prog: ModuleOp) -> None:
        try:
            super().apply_passes(prog)
        except PassFailedException as e:
            where = refusal_location(e)
            if where is None:
                raise
            raise PassFailedException(f"{where}: {e}") from None

    def parse_chunk(
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        from coconet.core.program import CocoError

        self._line_offset = start_offset

        data = chunk.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            # xDSL's parser decodes without a position ("error: utf-8"): name the byte.
            line = start_offset + data.count(b"\n", 0, e.start) + 1
            column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
            source = self.args.input_file or "<stdin>"
            raise CocoError(
                f"{source}:{line}:{column}: the input is not UTF-8 text "
                f"(byte 0x{data[e.start]:02x}: {e.reason})"
            ) from None
        try:
            module = super().parse_chunk(io.BytesIO(data), file_extension, start_offset)
        except OverflowError as e:
            # xDSL builds a float attribute of a literal its type cannot hold by packing it.
            source = self.args.input_file or "<stdin>"
            raise CocoError(f"{source}: a literal does not fit its type: {e}") from None
        # Verify what the user wrote before any pass sees it, so a layout violation is
        # reported against their program (with no passes, xDSL would not verify at all).
        if module is not None and not self.args.disable_verify:
            from coconet.dialects.program_rules import verify_program

            verify_program(module)
        return module


class LocatingParser(Parser):
    """xDSL's parser, giving every op the location of its first token in the input
    (`FileLineColLoc`), as MLIR's parser does; xDSL 0.74 keeps only a `loc(...)` written in the
    text. Passes keep an op's location when they refuse it, so coco-opt can say where."""

    def __init__(self, ctx: Context, text: bytes | str, name: str, line_offset: int = 0):
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        super().__init__(ctx, text, name)
        self._file = StringAttr(name)
        self._line_offset = line_offset
        self._newlines = [m.start() for m in re.finditer("\n", text)]

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):
            line = bisect.bisect_left(self._newlines, start)  # newlines before `start`
            column = start - (self._newlines[line - 1] + 1 if line else 0) + 1
            op.location = FileLineColLoc(
                self._file, IntAttr(line + 1 + self._line_offset), IntAttr(column)
            )
        return op


def refusal_location(e: object) -> str | None:
    """`FILE:LINE:COL` of the op a refusal (or a remark) is about (its `op`), if the parser
    located it."""
    op = getattr(e, "op", None)
    if not isinstance(op, Operation) or not isinstance(op.location, FileLineColLoc):
        return None
    loc = op.location
    return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"


def parse_python_program(path: str | None) -> ModuleOp:
    """A .py program (defining `program` or `build()`), as coco-run reads it: its module."""
    from coconet.core.program import CocoError, load

    if not path:
        raise CocoError("a .py program must be given as a file, not on stdin")
    return load(path).module


# -- the pass listing --------------------------------------------------------------------------


def _type_name(t: Any) -> str:
    """A pass option's type as a user writes its value: int, str, str,... (a tuple)."""
    if isinstance(t, str):  # annotations are strings under `from __future__ import annotations`
        t = t.replace("typing.", "")
        m = re.fullmatch(r"tuple\[(\w+), \.\.\.\]", t)
        if m:
            return f"{m.group(1)},..."
        return t.replace(" | None", "").replace("None | ", "")
    origin = typing.get_origin(t)
    if origin is tuple:
        inner = [a for a in typing.get_args(t) if a is not Ellipsis]
        return f"{_type_name(inner[0]) if inner else 'value'},..."
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in typing.get_args(t) if a is not type(None)]
        return "|".join(parts)
    return getattr(t, "__name__", str(t))


def pass_options(cls: type[ModulePass]) -> str:
    """`{name=type(default) ...}` of a pass's dataclass fields, as -p spells them; "" when it
    has none. A pass may spell an option differently from its field (coco-schedule's `name`
    is its `schedule` field): the default instance's spec says how."""
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name != "name"]
    if not fields:
        return ""
    spelled = {f.name: f.name.replace("_", "-") for f in fields}
    try:
        spec_names = list(cls().spec(include_default=True).parameters)
    except Exception:
        spec_names = []
    if len(spec_names) == len(fields):
        # -p reads `a-b` and `a_b` alike; the CLI's spelling is with dashes.
        spelled = {f.name: n.replace("_", "-") for f, n in zip(fields, spec_names)}
    parts = []
    for f in fields:
        text = f"{spelled[f.name]}={_type_name(f.type)}"
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if default is dataclasses.MISSING:
            text += "(required)"
        elif isinstance(default, bool):
            text += f"({str(default).lower()})"
        elif isinstance(default, str):
            text += f'("{default}")' if default else ""
        elif default not in (None, ()):
            text += f"({default})"
        parts.append(text)
    return "{" + " ".join(parts) + "}"


def pass_summary(cls: type[ModulePass]) -> str:
    """The first sentence of a pass's own docstring (not one it inherits, nor the signature
    a dataclass makes up for a class without one)."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc.strip() or doc.startswith(cls.__name__ + "("):
        return "(no description)"
    text = " ".join(doc.split())
    m = re.search(r"[.:](\s|$)", text)
    return text[: m.start() + 1].rstrip(":") if m else text


def pass_lines(passes: dict[str, Callable[[], type[ModulePass]]], indent: str = "") -> list[str]:
    """One line per pass: `NAME{OPTIONS}  summary` (summaries aligned after names up to 40
    columns; the line is as long as the summary: a cut description says too little)."""
    heads: list[tuple[str, str]] = []
    for name, factory in passes.items():
        try:
            cls = factory()
            heads.append((name + pass_options(cls), pass_summary(cls)))
        except Exception as e:
            heads.append((name, f"(cannot load: {type(e).__name__}: {e})"))
    column = min(max((len(h) for h, _ in heads), default=0), 40)
    return [f"{indent}{head:<{column}}  {summary}" for head, summary in heads]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got '{text}'"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _rank_counts(text: str) -> tuple[int, ...]:
    values = _int_list(text)
    if min(values) < 1:  # comparing at 0 ranks compares nothing
        raise argparse.ArgumentTypeError(f"expected rank counts of at least 1, got '{text}'")
    return values


def main(argv: Sequence[str] | None = None) -> None:
    warnings.filterwarnings("default", category=DeprecationWarning)
    from coconet.core.program import CocoError

    try:
        CocoOptMain(argv).run()
    except ParseError as e:
        # `FILE:LINE:COL: message` on the error line itself, then the source excerpt.
        print(f"coco-opt: error: {e.span.get_location()}: {e.msg}", file=sys.stderr)
        excerpt = e.span.print_with_context().partition("\n")[2]
        print(excerpt, end="", file=sys.stderr)
        if isinstance(e, MultipleSpansParseError):
            if e.ref_text is not None:
                print(e.ref_text, file=sys.stderr)
            for span, note in e.refs:
                print(span.print_with_context(note), end="", file=sys.stderr)
        sys.exit(1)
    except DiagnosticException as e:
        # xDSL's IRDL messages span lines ("... does not verify:\n<why>"): keep one line.
        msg = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"coco-opt: error: {msg}", file=sys.stderr)
        sys.exit(1)
    except CocoError as e:
        print(f"coco-opt: error: {e}", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:
        # `coco-opt --list-passes | head`: the reader left. Point stdout at /dev/null so that
        # the flush at exit does not fail again, and stop quietly.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except OSError as e:
        # A missing or unreadable input: its args are (errno, strerror).
        msg = e.strerror or str(e)
        print(f"coco-opt: error: {f'{e.filename}: ' if e.filename else ''}{msg}", file=sys.stderr)
        sys.exit(1)
    except (ValueError, KeyError) as e:
        # xDSL reports unknown passes, bad pass options and bad file names this way.
        msg = e.args[0] if e.args else str(e)
        print(f"coco-opt: error: {msg}", file=sys.stderr)
        sys.exit(1)
    except ArgSpecParseError as e:
        # A malformed -p pipeline (xDSL raises a BaseException for it).
        print(
            f"coco-opt: error: malformed pass pipeline: {e} (quote option values holding "
            "parentheses or commas: -p 'coco-schedule{name=\"fuse(rs-c-ag)\"}')",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
