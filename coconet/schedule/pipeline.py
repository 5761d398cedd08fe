"""Pass pipelines as text: coco-opt's `-p` syntax, printed from pass objects and parsed back."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from coconet.passes import get_all_passes
from coconet.schedule.errors import schedule_error

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    text = str(v)
    if _IDENT.fullmatch(text) and text not in ("true", "false"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_pass(p: ModulePass) -> str:
    """`p` as coco-opt pipeline text, options at their defaults left out: names print bare
    where xDSL's pipeline lexer reads them back as identifiers, quoted otherwise."""
    spec = p.spec()
    if not spec.parameters:
        return spec.name
    opts = []
    for key, values in spec.parameters.items():
        if not values:
            opts.append(key)
        else:
            opts.append(f"{key}=" + ",".join(_format_value(v) for v in values))
    return f"{spec.name}{{{' '.join(opts)}}}"


def format_pipeline(passes: Iterable[ModulePass]) -> str:
    return ",".join(format_pass(p) for p in passes)


# A pass registry: pass name -> its class, loaded on demand (xDSL's `get_all_passes` shape).
PassRegistry = Mapping[str, Callable[[], type[ModulePass]]]


def parse_passes(text: str, registry: PassRegistry) -> list[ModulePass]:
    """The passes of a coco-opt pipeline string, named in `registry` or xDSL's passes (the
    schedule API's `parse_pipeline` gives it the full registry, `coco-schedule` included)."""
    from xdsl.transforms import get_all_passes as xdsl_passes

    available = dict(xdsl_passes()) | dict(registry)
    try:
        return list(PassPipeline.parse_spec(available, text).passes)
    except (ValueError, DiagnosticException, ArgSpecParseError) as e:
        # ArgSpecParseError is a BaseException in xDSL 0.74
        hint = ""
        if "coco-schedule" in text and "(" in text:
            hint = ' (quote a schedule name with parentheses: name="fuse(rs-c-ag)")'
        raise schedule_error(
            "schedule-pipeline", f"cannot parse the pipeline '{text}'{hint}: {e}"
        ) from None


def make_pass(name: str, **options: Any) -> ModulePass:
    """The coconet pass `name` with `options`, those that are None left at their defaults."""
    cls = get_all_passes()[name]()
    return cls(**{k: v for k, v in options.items() if v is not None})
