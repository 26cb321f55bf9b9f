"""Every `lbbench ...` command shown in README.md and docs/*.md still parses against the click command tree.

A renamed or removed subcommand or flag fails here, in CI, instead of in a reader's terminal. The check does not
run the commands: it resolves the subcommand in `lbbench.cli.main`'s click group, checks that every `--flag` is
one of that command's options, and lets click parse the arguments with ``resilient_parsing=True`` (values are not
converted and required options are not demanded, so placeholders such as ``FILE`` or ``URL`` pass).

What is read:

- fenced code blocks (```` ``` ```` ... ```` ``` ````) of README.md and docs/*.md; indented blocks are not read;
- a line ending in ``\\`` is joined with the next one; ``#`` comments are dropped (shell rules, via ``shlex``);
- a leading ``.venv/bin/`` and leading ``NAME=VALUE`` environment assignments are stripped;
- a line holding several commands (``;``, ``&&``) is split; a command is one whose first word is ``lbbench``.

Synopsis notation is read as far as it parses, by these rules, applied in this order:

1. a command holding ``...`` or ``…`` (an elided part) is skipped, and listed by ``test_skipped_commands_are_few``;
2. ``[`` and ``]`` around optional parts are removed and the parts kept (``[--jobs N]`` checks ``--jobs``);
3. ``(`` and ``)`` around alternatives are removed, and a lone ``|`` between alternatives is dropped
   (``(--trace FILE | --workload SPEC)`` checks both flags);
4. a line that does not tokenise (unbalanced quotes) is reported as a failure, not skipped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from lbbench.cli import main as lbbench_main

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
ELLIPSIS = ("...", "…")


@dataclass(frozen=True)
class DocCommand:
    source: str  # "docs/x.md:LINE"
    text: str  # the joined command line as written
    argv: tuple[str, ...]  # the words after `lbbench`, synopsis notation removed
    skipped: str | None = None  # why it is not checked (rule 1), else None


def _fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, continuation lines joined."""
    out: list[tuple[int, str]] = []
    inside = False
    pending: tuple[int, str] | None = None
    for no, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
            if pending:
                out.append(pending)
                pending = None
            continue
        if not inside:
            continue
        if pending:
            start, acc = pending
            line = acc + " " + line.strip()
            no = start
        if line.rstrip().endswith("\\"):
            pending = (no, line.rstrip()[:-1])
            continue
        pending = None
        out.append((no, line))
    if pending:
        out.append(pending)
    return out


def _split_commands(words: list[str]) -> list[list[str]]:
    cmds: list[list[str]] = [[]]
    for w in words:
        if w in (";", "&&", "||"):
            cmds.append([])
        elif w.endswith(";") and len(w) > 1:
            cmds[-1].append(w[:-1])
            cmds.append([])
        else:
            cmds[-1].append(w)
    return [c for c in cmds if c]


def _strip_prefix(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words = words[1:]
    if words and words[0].startswith(".venv/bin/"):
        words = [words[0][len(".venv/bin/"):], *words[1:]]
    return words


def _unsynopsis(words: list[str]) -> list[str]:
    """Rules 2 and 3: drop optional brackets, alternative parentheses and lone bars, keep what they hold."""
    out = []
    for w in words:
        if w == "|":
            continue
        if w.startswith(("[", "(")) or w.endswith(("]", ")")):
            w = w.lstrip("[(").rstrip("])")
            if not w or w == "|":
                continue
        out.append(w)
    return out


def extract_commands(text: str, source: str) -> list[DocCommand]:
    """Every `lbbench` command in the fenced code blocks of one markdown text."""
    found: list[DocCommand] = []
    for no, line in _fenced_lines(text):
        if "lbbench" not in line:
            continue
        where = f"{source}:{no}"
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:  # rule 4
            found.append(DocCommand(where, line.strip(), ("<does not tokenise>", str(exc))))
            continue
        for cmd in _split_commands(words):
            cmd = _strip_prefix(cmd)
            if not cmd or cmd[0] != "lbbench":
                continue
            joined = " ".join(cmd)
            if any(w in ELLIPSIS or w.endswith(ELLIPSIS) for w in cmd[1:]):  # rule 1
                found.append(DocCommand(where, joined, tuple(cmd[1:]), skipped="elided part (...)"))
                continue
            found.append(DocCommand(where, joined, tuple(_unsynopsis(cmd[1:]))))
    return found


def _option_names(cmd: click.Command, ctx: click.Context) -> set[str]:
    names: set[str] = set()
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option):
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


def check_command(argv: tuple[str, ...], group: click.Group = lbbench_main) -> str | None:
    """None when `lbbench ARGV` parses against GROUP's command tree, else one line saying what does not."""
    if argv and argv[0] == "<does not tokenise>":
        return f"does not tokenise: {argv[1]}"
    cmd: click.Command = group
    path = ["lbbench"]
    rest = list(argv)
    parent = None
    while isinstance(cmd, click.Group):
        if not rest or rest[0] in ("--help", "--version"):
            return None
        name = rest.pop(0)
        ctx = click.Context(cmd, info_name=path[-1], parent=parent, resilient_parsing=True)
        sub = cmd.get_command(ctx, name)
        if sub is None:
            return f"`{' '.join(path)}` has no subcommand {name!r}"
        parent, cmd = ctx, sub
        path.append(name)
    ctx = click.Context(cmd, info_name=path[-1], parent=parent, resilient_parsing=True)
    known = _option_names(cmd, ctx) | {"--help"}
    for w in rest:
        if w == "--":
            break
        if w.startswith("--") and len(w) > 2:
            flag = w.split("=", 1)[0]
            if flag not in known:
                return f"`{' '.join(path)}` has no option {flag}"
        elif re.fullmatch(r"-[A-Za-z]", w) and w not in known:
            return f"`{' '.join(path)}` has no option {w}"
    try:
        cmd.make_context(path[-1], list(rest), parent=parent, resilient_parsing=True)
    except click.ClickException as exc:
        return f"`{' '.join(path)}`: {exc.format_message()}"
    return None


def _all_commands() -> list[DocCommand]:
    cmds = []
    for f in DOC_FILES:
        cmds.extend(extract_commands(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT))))
    return cmds


ALL = _all_commands()
CHECKED = [c for c in ALL if c.skipped is None]


def test_docs_hold_commands() -> None:
    # the extractor finds the README's commands and most of the docs'; a silent zero would check nothing
    assert sum(c.source.startswith("README.md") for c in CHECKED) >= 5
    assert len(CHECKED) >= 80


@pytest.mark.parametrize("doc_cmd", CHECKED, ids=[c.source for c in CHECKED])
def test_doc_command_parses(doc_cmd: DocCommand) -> None:
    problem = check_command(doc_cmd.argv)
    assert problem is None, f"{doc_cmd.source}: {problem}\n  {doc_cmd.text}"


def test_skipped_commands_are_few() -> None:
    skipped = [c for c in ALL if c.skipped]
    # the elided commands are summaries of commands shown in full elsewhere; keep them rare
    assert len(skipped) <= 10, "\n".join(f"{c.source}: {c.text}" for c in skipped)


# --- the checker itself


def test_checker_rejects_a_wrong_flag() -> None:
    md = "```bash\nlbbench run --router round_robin,jsq --no-such-flag 3\n```\n"
    (cmd,) = extract_commands(md, "x.md")
    problem = check_command(cmd.argv)
    assert problem is not None and "--no-such-flag" in problem


def test_checker_rejects_a_wrong_subcommand_and_a_flag_of_another_command() -> None:
    md = (
        "```bash\n"
        "lbbench profile derivee --model llama-3.1-8b --gpu h100\n"
        "lbbench compare runs/a runs/b --router jsq   # --router belongs to run, not compare\n"
        "```\n"
    )
    a, b = extract_commands(md, "x.md")
    assert "derivee" in (check_command(a.argv) or "")
    assert "--router" in (check_command(b.argv) or "")


def test_checker_reads_continuations_prefixes_and_synopsis() -> None:
    md = (
        "text outside a block: lbbench run --not-read\n"
        "```bash\n"
        ".venv/bin/lbbench run --profile llama2-7b-v100 \\\n"
        "    --router round_robin --rate 20     # a comment --not-a-flag\n"
        "OUT=DIR lbbench plan (--trace FILE | --workload SPEC) --rate R [--jobs N | --ray] --format table|json|html\n"
        "lbbench headroom ... --ray auto;  lbbench routers\n"
        "```\n"
        "    lbbench run --indented-block-not-read\n"
    )
    cmds = extract_commands(md, "x.md")
    assert [c.argv[0] for c in cmds] == ["run", "plan", "headroom", "routers"]
    assert cmds[0].argv == ("run", "--profile", "llama2-7b-v100", "--router", "round_robin", "--rate", "20")
    assert cmds[0].source == "x.md:3"
    assert "--trace" in cmds[1].argv and "--ray" in cmds[1].argv and "|" not in cmds[1].argv
    assert cmds[2].skipped and not cmds[3].skipped
    assert all(check_command(c.argv) is None for c in cmds if not c.skipped)
    # a renamed flag inside an optional group is still caught
    (bad,) = extract_commands("```\nlbbench plan --rate 2 [--job 3]\n```\n", "x.md")
    assert "--job" in (check_command(bad.argv) or "")


# --- links


def test_readme_names_only_docs_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"docs/[\w.\-]+\.md", readme))
    assert named, "the README names no docs page"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"README.md names docs pages that do not exist: {missing}"


def test_docs_links_to_pages_resolve() -> None:
    missing = []
    for f in DOC_FILES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", f.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (f.parent / target).resolve().is_file():
                missing.append(f"{f.relative_to(ROOT)} -> {target}")
    assert not missing, "\n".join(missing)
