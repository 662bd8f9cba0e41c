"""README.md's code runs as written, and the README names every public method of TensorDict.

The Python blocks of one ``##`` section make one script, in order: a block may use what an earlier
block of its section defined, never what another section did (each section starts from a fresh
namespace, as a reader trying one section would). The script is saved to a file in an empty
directory and run there with ``runpy.run_path(..., run_name="__main__")``, as ``python script.py``
would run it: ``if __name__ == "__main__":`` guards run, and processes it spawns find its functions.
A block meant to raise shows it with ``try`` / ``except``. Shell blocks (``sh``) are not run.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

import tdtree as tt

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# hand-written pages of the docs site that may name a method the README does not
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
LANGS = {"python", "sh", "text"}


def _blocks(text: str) -> list[tuple[str, str, str]]:
    """(section heading, language, code) of every fenced block, in order."""
    found = []
    for match in FENCE.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        found.append((headings[-1] if headings else "", match["lang"].strip(), match["body"]))
    return found


def _sections() -> dict[str, str]:
    scripts: dict[str, str] = {}
    for section, lang, code in _blocks(README.read_text()):
        if lang == "python":
            scripts[section] = scripts.get(section, "") + code + "\n"
    return scripts


SECTIONS = _sections()


def test_blocks_are_found() -> None:
    # the parser sees the blocks: a change of fence style must not empty the suite below
    assert {"Quick start", "A tour"} <= set(SECTIONS)
    assert all(lang in LANGS for _, lang, _ in _blocks(README.read_text())), "a block in another language"


@pytest.mark.parametrize("section", list(SECTIONS))
def test_section_runs(section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "readme_section.py"
    script.write_text(SECTIONS[section])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")


def test_shell_blocks_say_which_environment() -> None:
    # `make` sets up .venv; torchrun from a checkout is the one in it
    for _, lang, code in _blocks(README.read_text()):
        for line in code.splitlines():
            words = line.split()
            if lang == "sh" and words and words[0].endswith("torchrun"):
                assert words[0] == ".venv/bin/torchrun", line


def _code_words(text: str) -> set[str]:
    """The identifiers inside code: fenced blocks and inline spans."""
    spans = re.findall(r"```.*?```|`[^`\n]+`", text, re.S)
    return set(re.findall(r"[A-Za-z_]\w*", " ".join(spans)))


def test_every_public_method_is_named() -> None:
    public = {name for name in dir(tt.TensorDict) if not name.startswith("_")}
    assert {"update_", "at", "batch_size"} <= public
    named = _code_words(README.read_text() + "".join(page.read_text() for page in DOC_PAGES))
    assert sorted(public - named) == []
