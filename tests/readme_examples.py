"""The documents' code blocks, and the markers that say how tests/test_readme_examples.py runs them.

The documents are README.md, ARCHITECTURE.md and every page of docs/ (`documents()`).
Every code block of each is found: fenced blocks (```) and indented blocks (four
spaces, after a blank line, a heading or a marker). The line right before each block must
be a marker, an HTML comment that renders as nothing:

    <!-- example: KIND [OPTION ...] -->

Kinds:
- `python`: a program; it runs with the tests' Python and must exit 0.
- `shell`: each command (a line; a trailing backslash continues it) runs in a bash of its
  own, in order, and must exit 0. Shell variables do not carry from one line to the next.
- `skip reason="..."`: an example that cannot run here (it needs root, systemd, a cluster):
  the test reports it as skipped, with the reason.
- `text reason="..."`: not a command or a program (a diagram, a frame's layout, the
  contents of a file): not run.
- `spark`: a ```python block of the Spark page (docs/spark.md), for a Spark session `spark` and brokers
  at h1:61613 and h2:61613. tests/spark/test_spark_readme_examples.py runs these blocks in
  order, in one namespace, against two local brokers (h1:61613 and h2:61613 become their
  addresses, the relative paths given to the options `path` and `checkpointLocation` move
  into a temporary directory) and checks what they did; tests/test_readme_examples.py reports them skipped.

Options (a value with spaces goes in double quotes):
- `broker` or `broker="FLAGS"`: a curb broker serves the block's STOMP port first, with FLAGS.
- `serves`: each command starts a server: it must log `listening on`, then exit 0 on SIGTERM.
- `skip="PREFIX,..." reason="..."`: commands that start with a PREFIX are not run; the
  test reports them as skipped, with the reason.
- `terminal`: the commands run on a pseudo-terminal, where the test types PASSWORD at each
  password prompt.
- `env="NAME=VALUE ..."`: environment variables the block expects.
- `users=PATH`: a users file at PATH with the user alice (password PASSWORD, every permission).
- `certs=DIR`: a CA (DIR/ca.pem) and a server certificate for localhost and 127.0.0.1
  (DIR/tls.pem, DIR/tls.key).
- `expect="TEXT"`: the block's output (stdout and stderr) holds TEXT.
- `rdy=N`: once the block is done and no message is wip, the broker holds N rdy messages.

A block runs in a temporary directory of its own, as written but for these rewrites, made
in the block and in its marker's values alike:
- the ports 61613, 61614 and 8161 become free ports (the same ones for the block and its broker);
- paths under /etc/curb and /var/lib/curb move into the temporary directory, where their
  directories exist, as they would on the system;
- a command that starts with `bin/` runs the checkout's bin/ script (the documents' commands
  are typed at the checkout's top);
- `curb` is the command installed beside the tests' Python.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
README = TOP / "README.md"
ARCHITECTURE = TOP / "ARCHITECTURE.md"
DOCS = TOP / "docs"
PASSWORD = "correct horse"
PORTS = ("61613", "61614", "8161")
SYSTEM_DIRS = ("/etc/curb", "/var/lib/curb")
KINDS = ("python", "shell", "skip", "text", "spark")
OPTIONS = ("broker", "serves", "skip", "reason", "terminal", "env", "users", "certs", "expect", "rdy")
FLAG_OPTIONS = ("broker", "serves", "terminal")  # may be given without a value
SHELL_FENCES = ("", "sh", "bash", "shell", "console")

_MARKER = re.compile(r"<!--\s*example:(.*?)-->")
_FENCE = re.compile(r"( {0,3})(`{3,}|~{3,})\s*([^`\s]*)")
_PORT = re.compile(rf"(?<![\d.])({'|'.join(PORTS)})(?!\d)")
_SYSTEM_PATH = re.compile(rf"(?<![\w./-])({'|'.join(map(re.escape, SYSTEM_DIRS))})(?=/|\b)")


class MarkerError(ValueError):
    """A block without a marker, or a marker that does not say how to run it."""


@dataclass(frozen=True)
class Block:
    """One code block of a document: `line` is where its text starts (1-based), `fence`
    the fenced block's language ("" if none), None for an indented block; `document` the
    file it is in, relative to the checkout's top."""

    line: int
    fence: str | None
    text: str
    marker: str | None
    document: str

    def describe(self) -> str:
        first = next((t for t in self.text.splitlines() if t.strip()), "")
        return f"{self.document}:{self.line} {first.strip()[:60]}"


@dataclass(frozen=True)
class Example:
    """A block with its marker read: `kind` and `options` as the marker gives them."""

    block: Block
    kind: str
    options: dict[str, str]

    @property
    def skipped_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.options.get("skip", "").split(",") if p.strip())

    def commands(self) -> list[str]:
        """A shell block's commands, continuation lines joined, comment lines left out."""
        commands, pending = [], ""
        for raw in self.block.text.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            if line and not line.startswith("#"):
                commands.append(line)
        return commands

    def runs(self, command: str) -> bool:
        return not command.startswith(self.skipped_prefixes) if self.skipped_prefixes else True


def documents() -> list[Path]:
    """The documents whose examples run: README.md, ARCHITECTURE.md and docs/*.md."""
    return [README, ARCHITECTURE, *sorted(DOCS.glob("*.md"))]


def name(document: Path) -> str:
    """A document's path relative to the checkout's top, as test ids and messages give it."""
    return document.relative_to(TOP).as_posix()


def all_blocks() -> list[Block]:
    """Every code block of every document, in document order."""
    return [block for document in documents() for block in blocks(document.read_text(), name(document))]


def blocks(text: str, document: str) -> list[Block]:
    """Every code block of a Markdown text, with the marker on the line before it;
    `document` names the file the text is from."""
    lines = text.split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.fullmatch(lines[i])
        before = lines[i - 1] if i else ""
        if fence:
            indent, ticks, language = fence.groups()
            end = i + 1
            closing = re.compile(rf" {{0,3}}{ticks}{ticks[0]}*\s*")
            while end < len(lines) and not closing.fullmatch(lines[end]):
                end += 1
            body = [_dedent(line, len(indent)) for line in lines[i + 1 : end]]
            found.append(Block(i + 2, language, "\n".join(body), _marker(before), document))
            i = end + 1
        elif lines[i].startswith("    ") and lines[i].strip() and _may_precede_code(before):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            found.append(Block(i + 1, None, "\n".join(line[4:] for line in lines[i:end]), _marker(before), document))
            i = end
        else:
            i += 1
    return found


def example(block: Block) -> Example:
    """The block's marker read and checked; MarkerError says what is wrong with it."""
    if block.marker is None:
        raise MarkerError(
            f"{block.describe()}: no marker on the line before it; add one such as "
            f'<!-- example: shell broker --> or <!-- example: skip reason="..." --> (see tests/readme_examples.py)'
        )
    try:
        words = shlex.split(block.marker)
    except ValueError as err:
        raise MarkerError(f"{block.describe()}: marker {block.marker!r}: {err}") from None
    if not words or words[0] not in KINDS:
        raise MarkerError(f"{block.describe()}: the marker's kind must be one of {', '.join(KINDS)}")
    kind, options = words[0], {}
    for word in words[1:]:
        name, has_value, value = word.partition("=")
        if name not in OPTIONS:
            raise MarkerError(f"{block.describe()}: unknown marker option {name!r}; known: {', '.join(OPTIONS)}")
        if not has_value and name not in FLAG_OPTIONS:
            raise MarkerError(f"{block.describe()}: marker option {name} needs a value ({name}=...)")
        options[name] = value
    found = Example(block, kind, options)
    _check(found)
    return found


def _check(found: Example) -> None:
    block, kind, options = found.block, found.kind, found.options
    if (kind in ("skip", "text") or "skip" in options) and not options.get("reason"):
        raise MarkerError(f'{block.describe()}: say why it is not run: reason="..."')
    if kind in ("python", "spark") and block.fence != "python":
        raise MarkerError(f"{block.describe()}: a {kind} example must be a ```python block")
    if kind == "spark" and options:
        raise MarkerError(f"{block.describe()}: a spark example takes no options (its test starts the brokers)")
    if kind == "shell" and block.fence not in (None, *SHELL_FENCES):
        raise MarkerError(f"{block.describe()}: a shell example must be indented or a ```sh block")
    if kind != "shell" and {"serves", "skip", "terminal"} & options.keys():
        raise MarkerError(f"{block.describe()}: serves, skip= and terminal are for shell blocks")
    if "rdy" in options and ("broker" not in options or not options["rdy"].isdigit()):
        raise MarkerError(f"{block.describe()}: rdy=N needs a number and the broker option")
    if kind == "shell" and not found.commands():
        raise MarkerError(f"{block.describe()}: a shell block without a command")


class Rewrite:
    """The rewrites a block runs with: its ports and system paths moved into `root`."""

    def __init__(self, root: Path, ports: dict[str, int]):
        self.root = root
        self.ports = ports

    def __call__(self, text: str) -> str:
        text = _PORT.sub(lambda m: str(self.ports[m.group(1)]), text)
        return _SYSTEM_PATH.sub(lambda m: f"{self.root}{m.group(1)}", text)

    def command(self, command: str) -> str:
        command = self(command)
        return f"{TOP}/bin/{command[4:]}" if command.startswith("bin/") else command

    def make_dirs(self, text: str) -> None:
        """The directories of the system paths `text` names once rewritten, as the system has them."""
        for system in SYSTEM_DIRS:
            (self.root / system.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for path in re.findall(rf"{re.escape(str(self.root))}/[^\s'\"`),;]+", text):
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def _dedent(line: str, indent: int) -> str:
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def _may_precede_code(line: str) -> bool:
    """An indented block cannot continue a paragraph: it follows a blank line, a heading or a marker."""
    return not line.strip() or line.startswith("#") or bool(_MARKER.fullmatch(line.strip()))


def _marker(line: str) -> str | None:
    found = _MARKER.fullmatch(line.strip())
    return found.group(1).strip() if found else None
