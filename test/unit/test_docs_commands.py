"""The commands the documents show still run and print what they show (issue #27 item 5).

A code block of README.md or docs/*.md preceded by a `<!-- runnable ... -->` line is a
transcript: each `$ command` line (continued by a trailing backslash) runs from the
repository root with the project's tools on the PATH, must exit 0, and must print the lines
that follow it in the block, in order -- each as a prefix of a printed line once a trailing
`...` (an elision) is cut, and blank lines and lines that are only `...` skipped."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- runnable\b.*-->\s*$")


@dataclass(frozen=True)
class Transcript:
    where: str
    command: str
    shown: tuple[str, ...]


def transcripts() -> list[Transcript]:
    out: list[Transcript] = []
    for doc in DOCUMENTS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if not MARKER.match(line):
                continue
            assert lines[i + 1].startswith("```"), f"{doc.name}:{i + 1}: no code block follows"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            block = lines[i + 2 : end]
            k = 0
            while k < len(block):
                if not block[k].startswith("$ "):
                    k += 1
                    continue
                start = k
                command = block[k][2:]
                while command.endswith("\\"):
                    k += 1
                    command = command[:-1] + " " + block[k].strip()
                k += 1
                shown = []
                while k < len(block) and not block[k].startswith("$ "):
                    shown.append(block[k])
                    k += 1
                where = f"{doc.relative_to(ROOT)}:{i + 3 + start}"
                out.append(Transcript(where, command, tuple(shown)))
    return out


def test_the_documents_mark_transcripts():
    """The marker is in use (a renamed marker would silently check nothing)."""
    assert len(transcripts()) >= 3


@pytest.mark.parametrize("t", transcripts(), ids=lambda t: t.where)
def test_a_documented_command_prints_what_it_shows(t: Transcript):
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", "-c", t.command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{t.where}: {shlex.quote(t.command)} failed:\n{proc.stderr}"
    printed = proc.stdout.splitlines()
    at = 0
    for line in t.shown:
        want = line.rstrip()
        if want.endswith("..."):
            want = want[:-3].rstrip()
        if not want.strip():
            continue
        while at < len(printed) and not printed[at].rstrip().startswith(want):
            at += 1
        assert at < len(printed), (
            f"{t.where}: `{t.command}` does not print {line!r} (in order):\n{proc.stdout}"
        )
        at += 1
