"""Reading a launch script the way bash would, far enough to find the arguments it passes.

Launch scripts (Megatron-LM's ``examples/*/train_*.sh``, Slurm batch scripts, our own exports)
set variables (``TP=${TP:-8}``, ``WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))``), collect options
in arrays (``MODEL_ARGS=( --num-layers 32 ... )``, ``ARGS+=(...)``), branch on simple tests
(``if [[ "$DTYPE" == "fp8" ]]; then ... fi``) and run a launcher (``torchrun ... pretrain_gpt.py
"${ARGS[@]}"``, ``srun``, ``deepspeed``).  ``read_shell`` evaluates exactly that subset:

* assignments (``export`` too), ``${VAR}``, ``${VAR:-default}``/``${VAR:=default}``, positional
  ``$1``/``${10}``/``${1:-default}``, ``$#``, ``"$@"`` and ``shift`` over the arguments the script is
  given (``args``; none given: the default or empty, and the hint names them), the caller's
  environment (``env``, overridden by the script's own assignments), ``$((arithmetic))`` on
  integers; unset variables expand to nothing, as in bash; ``$(command)`` is not run (its text
  stays);
* a quoted string that spans lines (``ARGS="\n  --num-layers 32\n"``): the newlines are part of
  the string, so the option words come out when it is expanded unquoted;
* arrays and ``+=``; ``"${ARR[@]}"`` and unquoted ``${ARR[@]}`` expand to the elements, an
  element holding spaces (``"--fp8-format hybrid"``) splits when expanded unquoted;
* ``if``/``elif``/``else``/``fi`` (also on one line) with ``[ ]``/``[[ ]]`` tests (``==``, ``=``,
  ``!=``, ``-n``, ``-z``, integer ``-eq``/``-ne``/``-lt``/``-le``/``-gt``/``-ge``, joined by
  ``&&``/``||``); a test it cannot evaluate takes the ``then`` branch and says so in
  ``warnings``;
* here-documents (``cat <<EOT > $DS_CONFIG`` ... ``EOT``, ``<<-``, a quoted delimiter without
  expansion): the body is not run; what it writes is kept (``ShellScript.files``);
* ``eval WORDS``: the words joined and read again, a word that starts with ``#`` opening a
  comment there as in bash (the rest of the command is dropped, with a warning);
* ``#SBATCH`` directives (nodes, GPUs and tasks per node) and the launcher's own options
  (``torchrun --nproc_per_node/--nnodes``, ``deepspeed --num_gpus/--num_nodes``).

A command line whose words include a Python script (``*.py``) passes the words after it to the
script (``ShellScript.commands``); lines that are only options (an args file) count as one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_VAR = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?]))")
_ARITH = re.compile(r"\$\(\((.*?)\)\)")


@dataclass(slots=True)
class Command:
    """One command line: the launcher's words and, after a ``*.py`` script, the script's."""

    launcher: list[str]
    script: str
    args: list[str]
    line: int


@dataclass(slots=True)
class ShellScript:
    variables: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    commands: list[Command] = field(default_factory=list)
    sbatch: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)  # variables used without a value or a default
    sourced: list[str] = field(default_factory=list)  # files the script sources (not read)
    args: list[str] = field(default_factory=list)  # its positional arguments ($1 ...), as ``shift`` leaves them
    unset_args: list[str] = field(default_factory=list)  # positional arguments read but not given
    files: dict[str, str] = field(default_factory=dict)  # what here-documents write: path -> text

    def unread_hint(self) -> str:
        """Why an option may have lost its value: arguments not given, variables never set here,
        files not followed."""
        parts = []
        if self.unset_args:
            nums = sorted(int(n) for n in self.unset_args)
            ref = [f"${{{k}}}" if k > 9 else f"${k}" for k in nums]  # $1 .. $9, ${10} ..
            contiguous = len(nums) > 2 and nums == list(range(nums[0], nums[-1] + 1))
            span = f"{ref[0]}..{ref[-1]}" if contiguous else ", ".join(ref[:6])
            parts.append(f"the script reads its arguments {span}, {len(self.args)} given (--recipe-args)")
        if self.unset:
            parts.append("the script uses " + ", ".join(f"${n}" for n in self.unset[:4]) + " without setting it")
        if self.sourced:
            parts.append("it sources " + ", ".join(self.sourced[:2]) + ", which is not read")
        return "; ".join(parts)


_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def _logical_lines(text: str) -> list[tuple[int, str, tuple[str, bool] | None]]:
    """Lines with continuations joined, and a quoted string that spans lines kept whole (its
    newlines become spaces: what word splitting makes of them when it is expanded unquoted); a
    line with a here-document (``cat <<EOT > file``) carries its body and whether the delimiter
    was quoted (no expansion), and the body's lines are not commands."""
    out: list[tuple[int, str, tuple[str, bool] | None]] = []
    buf, start, quote = "", 0, ""
    raw_lines = text.splitlines()
    k = 0
    while k < len(raw_lines):
        no, line = k + 1, raw_lines[k].rstrip()
        k += 1
        if not buf:
            start = no
        doc = _heredoc_in(_strip_comment(line)) if not quote else None
        if doc is not None:
            body: list[str] = []
            while k < len(raw_lines):
                nxt = raw_lines[k]
                k += 1
                if (nxt.lstrip("\t") if doc.group(1) else nxt).rstrip() == doc.group(3):
                    break
                body.append(nxt.lstrip("\t") if doc.group(1) else nxt)
            out.append((start, buf + line, ("\n".join(body), bool(doc.group(2)))))
            buf = ""
            continue
        cont = line.endswith("\\") and not _escaped(line, len(line) - 1)
        if cont:
            line = line[:-1]
        quote = _open_quote(line, quote)
        if cont or quote:
            buf += line + " "
            continue
        buf += line
        out.append((start, buf, None))
        buf = ""
    if buf:
        out.append((start, buf, None))
    return out


def _heredoc_in(line: str) -> re.Match | None:
    """The here-document operator of ``line``, outside quotes and ``$((...))`` (where ``<<`` is a
    shift), or None."""
    quote, depth = "", 0
    for i, ch in enumerate(line):
        if quote or ch in "'\"":
            quote = _quote_after(line, i, quote)
        elif line.startswith("$((", i):
            depth += 1
        elif line.startswith("))", i) and depth:
            depth -= 1
        elif line.startswith("<<", i) and not depth and not line.startswith("<<<", i):
            return _HEREDOC.match(line, i)
    return None


def _quote_after(line: str, i: int, quote: str) -> str:
    """The quote open after the character at ``i`` when ``quote`` was open before it (a
    backslash-escaped quote neither opens nor, inside double quotes, closes one)."""
    ch = line[i]
    if quote:
        return "" if ch == quote and not (quote == '"' and _escaped(line, i)) else quote
    return ch if ch in "'\"" and not _escaped(line, i) else ""


def _escaped(line: str, i: int) -> bool:
    """Whether the character at ``i`` follows an odd number of backslashes."""
    n = 0
    while i - n - 1 >= 0 and line[i - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def _open_quote(line: str, quote: str) -> str:
    """The quote still open at the end of ``line`` when ``quote`` was open at its start (a ``#``
    that starts a word outside quotes ends the scan: the rest is a comment)."""
    prev = " "
    for i, ch in enumerate(line):
        if quote or ch in "'\"":
            quote = _quote_after(line, i, quote)
        elif ch == "#" and prev in " \t;(":
            break
        prev = ch
    return quote


def _strip_comment(line: str) -> str:
    """Drop a ``#`` comment that starts a word outside quotes."""
    quote = ""
    prev = " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev in " \t;(" and not line[:i].rstrip().endswith("$"):
            return line[:i]
        prev = ch
    return line


class _Env:
    def __init__(self, script: ShellScript) -> None:
        self.s = script

    def value(self, name: str) -> str:
        if name.isdigit():  # positional: $0 is the script, $1 ... its arguments
            k = int(name)
            return self.s.args[k - 1] if 0 < k <= len(self.s.args) else ""
        if name == "#":
            return str(len(self.s.args))
        if name in ("@", "*"):
            return " ".join(self.s.args)
        if name in self.s.arrays:
            return " ".join(self.s.arrays[name])
        return self.s.variables.get(name, "")

    def expand(self, text: str) -> str:
        """Variables and arithmetic in one word's text (no word splitting)."""
        def arith(mt: re.Match) -> str:
            expr = self.expand(mt.group(1))
            expr = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda v: self.value(v.group(0)) or "0", expr)
            if re.fullmatch(r"[\d\s+\-*/%()]+", expr) and "**" not in expr and len(expr) < 200:
                try:
                    return str(int(eval(expr.replace("/", "//"), {"__builtins__": {}}, {})))  # noqa: S307 digits/operators only
                except (SyntaxError, ZeroDivisionError, ValueError):
                    return mt.group(0)
            return mt.group(0)

        text = _ARITH.sub(arith, text)

        def var(mt: re.Match) -> str:
            inner = mt.group(1) if mt.group(1) is not None else mt.group(2)
            m2 = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[#@*])(?::?([-=+?])(.*))?", inner, re.S)
            if m2 is None:
                arr = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", inner)
                if arr:
                    return " ".join(self.s.arrays.get(arr.group(1), []))
                return ""
            name, op, default = m2.group(1), m2.group(2), m2.group(3)
            cur = self.value(name)
            if op is None and not cur and name.isdigit() and name != "0" and name not in self.s.unset_args:
                self.s.unset_args.append(name)
            if op in ("-", "=") and not cur:
                cur = self.expand(_unquote(default or ""))
                if op == "=" and not name.isdigit():
                    self.s.variables[name] = cur
            elif op == "+":
                cur = self.expand(_unquote(default or "")) if cur else ""
            elif op is None and not cur and not name.isdigit() and name not in self.s.variables \
                    and name not in self.s.arrays and name not in self.s.unset:
                self.s.unset.append(name)
            return cur

        return _VAR.sub(var, text)

    def words(self, text: str) -> list[str]:
        """Shell words of ``text`` with expansions; unquoted expansions split on spaces."""
        out: list[str] = []
        for tok_src in _split_keep_quotes(text):
            if tok_src in ('"$@"', "$@", '"$*"', "$*", '"${@}"', "${@}"):
                out += list(self.s.args)  # the script's own arguments (``args``; none unless given)
                continue
            quoted_whole = len(tok_src) >= 2 and tok_src[0] == tok_src[-1] == '"'
            arr = re.fullmatch(r'"?\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}"?', tok_src)
            if arr:
                for el in self.s.arrays.get(arr.group(1), []):
                    out += [el] if tok_src.startswith('"') else el.split()
                continue
            if tok_src.startswith("'"):
                out.append(tok_src.strip("'"))
                continue
            val = self.expand(tok_src[1:-1] if quoted_whole else tok_src)
            if quoted_whole:
                out.append(val)
            else:
                out += [w.strip('"').strip("'") for w in val.split()]
        return out


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _split_keep_quotes(text: str) -> list[str]:
    """Words of a line, keeping their quotes (so expansion can tell quoted from unquoted); a
    ``${...}``, ``$(...)`` or ``$((...))`` stays one word whatever spaces it holds."""
    out, cur, quote, depth, paren = [], "", "", 0, 0
    for ch in text:
        if quote:
            cur += ch
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
            cur += ch
        elif ch == "{" and cur.endswith("$"):
            depth += 1
            cur += ch
        elif ch == "}" and depth:
            depth -= 1
            cur += ch
        elif ch == "(" and (cur.endswith("$") or cur.endswith("$(") or paren):
            paren += 1
            cur += ch
        elif ch == ")" and paren:
            paren -= 1
            cur += ch
        elif ch.isspace() and not depth and not paren:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


_INT_TESTS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
              "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}


def _test(expr: str, env: _Env) -> bool | None:
    """A ``[ ]``/``[[ ]]`` test list; None when it cannot be evaluated."""
    expr = expr.strip()
    parts = re.split(r"\s*(\|\||&&)\s*", expr)
    result: bool | None = None
    op = ""
    for part in parts:
        if part in ("||", "&&"):
            op = part
            continue
        mt = re.fullmatch(r"\[\[?\s*(.*?)\s*\]?\]", part.strip())
        if mt is None:
            return None
        words = env.words(mt.group(1).replace("]", "").strip())
        negate = bool(words) and words[0] == "!"
        if negate:
            words = words[1:]
        if len(words) == 2 and words[0] in ("-f", "-d", "-e", "-x", "-s", "-r"):
            val = not negate  # files on the machine that runs it: assumed present
            result = val if result is None else (result or val if op == "||" else result and val)
            continue
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            val = (words[0] == words[2]) == (words[1] != "!=")
        elif len(words) == 3 and words[1] in _INT_TESTS and all(re.fullmatch(r"-?\d+", w) for w in words[::2]):
            val = _INT_TESTS[words[1]](int(words[0]), int(words[2]))
        elif len(words) == 2 and words[0] in ("-n", "-z"):
            val = bool(words[1]) == (words[0] == "-n")
        elif len(words) == 1 and words[0] in ("-n", "-z"):  # an unset variable expanded to nothing
            val = words[0] == "-z"
        else:
            return None
        val = val != negate
        result = val if result is None else (result or val if op == "||" else result and val)
    return result


def read_shell(text: str, *, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> ShellScript:
    """Evaluate ``text`` as far as the module docstring says, run with the positional ``args``
    in the environment ``env``."""
    script = ShellScript(variables=dict(env or {}), args=list(args))
    shell = _Env(script)
    for raw in text.splitlines():
        mt = re.match(r"^\s*#SBATCH\s+(.*)$", raw)
        if mt:
            for word in shlex.split(mt.group(1), comments=True):
                key, _, val = word.partition("=")
                script.sbatch[key] = val
    lines = _logical_lines(text)
    stack: list[list[bool]] = []  # per if-block: [this branch active, a branch already taken]

    def active() -> bool:
        return all(b[0] for b in stack)

    i = 0
    pending_array: tuple[str, bool, str, int] | None = None
    while i < len(lines):
        no, line, doc = lines[i]
        i += 1
        body = _strip_comment(line).strip()
        if doc is not None:
            # ``cat <<EOT > FILE`` / ``cat > FILE <<EOT``: the file the here-document writes
            # (Megatron-DeepSpeed's examples write their DeepSpeed config so)
            body = _HEREDOC.sub("", body)
            target = re.search(r">\s*(\S+)", body)
            if target is not None and active():
                text_ = doc[0] if doc[1] else "\n".join(shell.expand(t) for t in doc[0].split("\n"))
                script.files[shell.expand(_unquote(target.group(1)))] = text_
            continue
        if pending_array is not None:
            name, append, acc, start = pending_array
            acc += " " + body
            if _closes_array(acc):
                pending_array = None
                if active():
                    _set_array(script, shell, name, append, acc)
            else:
                pending_array = (name, append, acc, start)
            continue
        if not body:
            continue
        for stmt in _keywords_apart(_statements(body)):
            head = stmt.split(None, 1)[0] if stmt.split() else ""
            if head in ("if", "elif"):
                cond = re.sub(r"^(el)?if\s+", "", stmt)
                cond = re.sub(r";?\s*then\s*$", "", cond).strip()
                if head == "if":
                    stack.append([False, False])
                blk = stack[-1] if stack else [False, False]
                if blk[1]:
                    blk[0] = False
                    continue
                val = _test(cond, shell) if all(b[0] for b in stack[:-1]) else False
                if val is None:
                    script.warnings.append(f"line {no}: could not evaluate `{cond}`: took its branch")
                    val = True
                blk[0] = bool(val)
                blk[1] = blk[1] or bool(val)
                continue
            if head == "then":
                continue
            if head == "else":
                if stack:
                    stack[-1][0] = not stack[-1][1]
                    stack[-1][1] = True
                continue
            if head == "fi":
                if stack:
                    stack.pop()
                continue
            if not active():
                continue
            am = _ASSIGN.match(stmt)
            if am and not stmt.startswith(("--", "-")):
                name, append, value = am.group(1), am.group(2) == "+", am.group(3)
                if value.lstrip().startswith("("):
                    if _closes_array(value):
                        _set_array(script, shell, name, append, value)
                    else:
                        pending_array = (name, append, value, no)
                    continue
                words = shell.words(value) if value.strip() else [""]
                val = " ".join(words) if len(words) != 1 else words[0]
                script.variables[name] = (script.variables.get(name, "") + val) if append else val
                continue
            _command(script, shell, stmt, no)
    return script


def _keywords_apart(stmts: list[str]) -> list[str]:
    """``then X`` / ``else X`` (an ``if`` on one line: ``if [ ... ]; then A=1; fi``) as the keyword
    and the command after it."""
    out: list[str] = []
    for stmt in stmts:
        parts = stmt.split(None, 1)
        if len(parts) == 2 and parts[0] in ("then", "else"):
            out += parts
        else:
            out.append(stmt)
    return out


def _statements(body: str) -> list[str]:
    """Split ``a; then b`` style lines at ``;`` outside quotes and brackets."""
    out, cur, quote, depth = [], "", "", 0
    for ch in body:
        if quote:
            cur += ch
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        if ch == ";" and not depth:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _closes_array(text: str) -> bool:
    depth, quote = 0, ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return True
    return False


def _set_array(script: ShellScript, env: _Env, name: str, append: bool, text: str) -> None:
    inner = text.strip()
    inner = inner[inner.index("(") + 1:inner.rindex(")")]
    words: list[str] = []
    for part in inner.splitlines() or [inner]:
        part = _strip_comment(part)
        for w in _split_keep_quotes(part):
            if w.startswith('"') and w.endswith('"') and len(w) >= 2 and not w.startswith('"${'):
                words.append(env.expand(w[1:-1]))
            else:
                words += env.words(w)
    script.arrays[name] = (script.arrays.get(name, []) + words) if append else words


_NOT_LAUNCHERS = ("echo", "printf", "cat", "mkdir", "cd", "ls", "rm", "cp", "mv", "test", "exit", "[", "[[", "set",
                  "source", ".", "wait", "sleep", "export", "unset", "trap", "git", "pip", "nvidia-smi")


_LIST_OPS = ("|", "||", "&&", "&", "|&")


def _command(script: ShellScript, env: _Env, stmt: str, no: int) -> None:
    words = env.words(stmt)
    # the command ends at a pipe or list operator (`... | tee log`, `... && echo done`); redirections
    # (`> log`, `2>&1`, `>> out`) and their targets are not words of it
    for k, w in enumerate(words):
        if w in _LIST_OPS:
            words = words[:k]
            break
    kept: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if re.fullmatch(r"(\d*|&)(>>?|<)", w):  # `> log`, `2> err`, `&> all`: the target is the next word
            skip = True
            continue
        if re.fullmatch(r"(\d*|&)(>>?|<)\S+|\d*>&\d+", w):  # `>log`, `2>&1`
            continue
        kept.append(w)
    words = kept
    if words and words[0] == "eval":
        # eval joins its (expanded) words and parses the result as shell input again: a word that
        # starts with '#' there opens a comment, so the words after it never run (FlagPerf's
        # megatron-deepspeed_main.sh builds its command in a string with a '#--recompute-activations'
        # line and runs `eval $cmd`: the options after it are dropped, as bash drops them)
        text = " ".join(words[1:])
        kept = _strip_comment(text)
        if kept != text:
            lost = text[len(kept):].split()
            script.warnings.append(f"line {no}: eval reads `{lost[0]}` as a comment: the {len(lost)} words from it on "
                                   "are not run (as bash does)")
        for stmt2 in _statements(kept):
            _command(script, env, stmt2, no)
        return
    if words and words[0] == "shift":  # drops the first n positional arguments (default 1)
        n = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
        del script.args[:n]
        return
    if len(words) > 1 and words[0] in ("source", "."):
        script.sourced.append(words[1])
        script.warnings.append(f"line {no}: sources {words[1]}, which is not read: what it sets expands to nothing")
    if not words or words[0] in _NOT_LAUNCHERS:
        return
    for k, w in enumerate(words[:-1]):  # srun ... sh -c "python pretrain_gpt.py ...": the inner command
        if w == "-c" and k > 0 and words[k - 1].rsplit("/", 1)[-1] in ("sh", "bash"):
            before = len(script.commands)
            _command(script, env, words[k + 1].replace("\n", " "), no)
            for c in script.commands[before:]:
                c.launcher = words[:k - 1] + c.launcher
            return
    for k, w in enumerate(words):
        if w.endswith(".py"):
            script.commands.append(Command(launcher=words[:k], script=w, args=words[k + 1:], line=no))
            return
    if words[0].startswith("--"):
        script.commands.append(Command(launcher=[], script="", args=words, line=no))
        return
    if words[0] in ("torchrun", "srun", "deepspeed", "python", "python3", "mpirun") or \
            words[0].endswith(("torchrun", "deepspeed")):
        script.commands.append(Command(launcher=words, script="", args=[], line=no))


def launcher_option(words: list[str], *names: str) -> str | None:
    """The value of a launcher option (``--nproc_per_node 8`` or ``--nproc-per-node=8``)."""
    for k, w in enumerate(words):
        key, eq, val = w.partition("=")
        if key in names:
            if eq:
                return val
            if k + 1 < len(words):
                return words[k + 1]
    return None
