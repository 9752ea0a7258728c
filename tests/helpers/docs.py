"""Checkers of the README and docs/*.md against the tree they describe: links and their anchors,
the `make` targets, the commands and the paths they name. Each returns its offenders as
'file:line: reference (why)', so a failing test lists every one at once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")  # indented too: a block inside a list item
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HREF = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"", re.IGNORECASE)
EXPLICIT_ANCHOR = re.compile(r"<a\s[^>]*(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
# A `make` run: at the start of the code or after a shell separator, perhaps behind sudo or VAR=value.
MAKE = re.compile(r"(?:^|&&|\|\||;|\(|\$|\bsudo\b)\s*(?:\w+=\S*\s+)*make((?:\s+[^\s;&|)#]+)+)")
TARGET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
RULE = re.compile(r"^([A-Za-z0-9_.-][A-Za-z0-9_. -]*?)\s*::?(?!=)")
PYTHON_M = re.compile(r"\bpython[0-9.]*\s+-m\s+(dpstudy(?:\.\w+)*)")
TOP_FOLDERS = "dpstudy|tests|rules|scripts|benchmarks|config|profiles|notebooks|envs|requirements|docs|examples"
PATH = re.compile(rf"(?<![\w./~$-])((?:{TOP_FOLDERS})/[^\s`'\",;()\[\]]*)")
PLACEHOLDER = re.compile(r"[{}<>]|\.\.\.")
GLOB = re.compile(r"[*?\[]")


def doc_files(repo: Path) -> list[Path]:
    """The pages these checks read: the README and every page under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def where(path: Path, root: Path, line: int) -> str:
    return f"{path.relative_to(root) if path.is_relative_to(root) else path}:{line}"


def prose_and_code(text: str) -> Iterator[tuple[int, str, str, list[str]]]:
    """(line number, the line outside fenced blocks, that line with its code spans blanked, the
    code spans that start on it): a line of a fenced block is code entire, less a comment after
    ' #' (words, not commands). A code span may run over the lines of a paragraph, not of a table."""
    fence, block = "", []
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence:
            if opening and opening[1][0] == fence[0] and len(opening[1]) >= len(fence) and not line.strip(" `~"):
                fence = ""
            else:
                yield number, "", "", [re.sub(r"(^|\s)#.*$", "", line)]
        elif opening or not line.strip() or line.lstrip().startswith("|"):
            yield from paragraph(block)
            block, fence = [], opening[1] if opening else ""
            if line.lstrip().startswith("|"):
                yield from paragraph([(number, line)])
        else:
            block.append((number, line))
    yield from paragraph(block)


def paragraph(block: list[tuple[int, str]]) -> Iterator[tuple[int, str, str, list[str]]]:
    if not block:
        return
    text = "\n".join(line for _, line in block)
    starts = [0]
    for _, line in block[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    spans: dict[int, list[str]] = {}
    for match in CODE_SPAN.finditer(text):
        row = max(i for i, start in enumerate(starts) if start <= match.start())
        spans.setdefault(row, []).append(" ".join(match[2].split()))
    prose = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text).split("\n")
    for row, (number, line) in enumerate(block):
        yield number, line, prose[row], spans.get(row, [])


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lowercased, punctuation but '-' and
    '_' removed, each space a '-'."""
    parts = re.split(r"(`+[^`]*`+)", heading)
    text = "".join(p.strip("`") if p.startswith("`") else re.sub(r"<[^>]+>", "", p) for p in parts)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' (a repeated one gets -1, -2, ...) and the explicit
    <a id="..."> and <a name="..."> ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line, prose, _ in prose_and_code(text):
        found.update(EXPLICIT_ANCHOR.findall(prose))
        match = HEADING.match(line)
        if match:
            base = slug(match[2])
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line, target) of every link outside code: [text](target), reference definitions, href."""
    for number, _, prose, _ in prose_and_code(text):
        for pattern in (LINK, DEFINITION, HREF):
            for match in pattern.finditer(prose):
                yield number, match[1]


def broken_links(files: list[Path], root: Path) -> list[str]:
    """Relative links whose file does not exist, or whose #anchor the target page lacks."""
    broken, cache = [], {}
    for page in files:
        for number, target in links(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http(s), mailto: not checked here
            path, _, anchor = unquote(target).partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{where(page, root, number)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md":
                cache.setdefault(linked, anchors(linked.read_text()) if linked.is_file() else set())
                if anchor not in cache[linked]:
                    broken.append(f"{where(page, root, number)}: {target} (no such anchor)")
    return broken


def make_targets(makefile: Path) -> set[str]:
    """The Makefile's rule names and .PHONY targets (recipe lines and variables are neither)."""
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        if line.startswith("\t") or "=" in line.split(":", 1)[0]:
            continue
        if line.startswith(".PHONY:"):
            targets.update(line.split(":", 1)[1].split())
        elif match := RULE.match(line):
            targets.update(t for t in match[1].split() if not t.startswith("."))
    return targets


def named_make_targets(code: str) -> list[str]:
    """The targets of every `make` run in a piece of code: the words after it up to the first that
    is neither a target nor an option or VAR=value."""
    named = []
    for match in MAKE.finditer(code):
        for word in match[1].split():
            if "=" in word or word.startswith("-"):
                continue
            if not TARGET.match(word):
                break
            named.append(word)
    return named


def unknown_make_targets(files: list[Path], makefile: Path, root: Path) -> list[str]:
    targets = make_targets(makefile)
    return [
        f"{where(page, root, number)}: make {name} (no such target)"
        for page in files
        for number, _, _, spans in prose_and_code(page.read_text())
        for span in spans
        for name in named_make_targets(span)
        if name not in targets
    ]


def module_exists(module: str, repo: Path) -> bool:
    """Whether `python -m module` runs a file of the repo: a module or a package's __main__."""
    base = repo.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def path_exists(reference: str, repo: Path) -> bool | None:
    """Whether a path the docs name exists (a glob: matches something); None for a placeholder."""
    reference = re.sub(r"(:\d[\d-]*|#.*|:[A-Za-z_]\w*)$", "", reference.rstrip(".,;:!?")).rstrip(".,;:!?")
    if not reference or PLACEHOLDER.search(reference):
        return None
    if GLOB.search(reference):
        return any(repo.glob(reference.rstrip("/")))
    return (repo / reference).exists()


def missing_commands_and_paths(files: list[Path], repo: Path) -> list[str]:
    """`python -m dpstudy.X` whose module does not exist, and repo paths named in code (scripts/,
    benchmarks/, examples/ commands among them) that do not exist; results/ are outputs, skipped."""
    missing = []
    for page in files:
        for number, _, _, spans in prose_and_code(page.read_text()):
            for span in spans:
                missing += [
                    f"{where(page, repo, number)}: python -m {m} (no such module)"
                    for m in PYTHON_M.findall(span)
                    if not module_exists(m, repo)
                ]
                missing += [
                    f"{where(page, repo, number)}: {p} (no such path)"
                    for p in PATH.findall(span)
                    if path_exists(p, repo) is False
                ]
    return missing


def too_long(page: Path, limit: int) -> list[str]:
    lines = len(page.read_text().splitlines())
    return [f"{page.name}: {lines} lines, more than {limit}"] if lines > limit else []
