"""Languages: how a request names one, which ones this template runs, and the statements that
set and restore environment variables inside each kernel.

Sans-IO: tables and pure functions only, table-tested in ``tests/runtime/interpreter``.
The server applies the generated statements as silent executions (``silent=True``,
``store_history=False``), so they never show up in a run's output or execution count.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Final

# Request spelling (after lowercase and trim) → normalized language. These are the aliases the
# upstream server accepts; every other spelling passes through unchanged, and a missing or
# empty language means python.
ALIASES: Final[Mapping[str, str]] = {
    "": "python",
    "js": "javascript",
    "ts": "typescript",
}

# Language → the kind of kernel that runs it (``_kernels`` starts each kind). TypeScript runs on
# the JavaScript kernel, as upstream's does: Deno's kernel compiles every cell as TypeScript.
KERNEL_KINDS: Final[Mapping[str, str]] = {
    "python": "python",
    "javascript": "deno",
    "typescript": "deno",
    "r": "r",
    "java": "java",
    "bash": "bash",
}
SUPPORTED_LANGUAGES: Final[tuple[str, ...]] = tuple(KERNEL_KINDS)
# Started with the server, as upstream's are; the others on their first use.
STARTUP_LANGUAGES: Final[tuple[str, ...]] = ("python", "javascript")
# What each startup language's kernel runs once, silently (no output, history or count), before it
# is offered: a statement that leaves nothing behind in the user's namespace.
WARM_UP: Final[Mapping[str, str]] = {"python": "pass", "javascript": "undefined;"}

# Which names each kind accepts for an environment variable. The process environment takes
# anything without "=" or NUL; bash's export takes identifiers only. Names outside these are
# skipped (and logged by the caller) rather than turned into statements that fail.
_ANY_NAME = re.compile(r"[^=\x00]+")
_ENV_NAME: Final[Mapping[str, re.Pattern[str]]] = {
    "python": _ANY_NAME,
    "deno": _ANY_NAME,
    "r": _ANY_NAME,
    "java": _ANY_NAME,
    "bash": re.compile(r"[A-Za-z_][A-Za-z0-9_]*"),
}


def normalize_language(language: str | None) -> str:
    """The upstream normalization: lowercase and trim, two aliases, empty means python."""
    key = (language or "").strip().lower()
    return ALIASES.get(key, key)


def is_supported(language: str) -> bool:
    return language in SUPPORTED_LANGUAGES


def unsupported_message(language: str) -> str:
    """The text of the 500 answer for a language without a kernel in this template.

    Upstream answers a failed kernel creation with 500 and ``Failed to create context: …``.
    """
    supported = ", ".join(SUPPORTED_LANGUAGES)
    return (
        f"Failed to create context: the {language!r} language is not supported by this template"
        f" (supported: {supported})"
    )


def kind_of(language: str) -> str:
    """The kernel kind of a supported language."""
    return KERNEL_KINDS[language]


def split_env(language: str, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(usable, skipped names)``: variables a kernel of ``language`` can hold, and the rest."""
    pattern = _ENV_NAME[kind_of(language)]
    usable: dict[str, str] = {}
    skipped: list[str] = []
    for name, value in env.items():
        if pattern.fullmatch(name) and "\x00" not in value:
            usable[name] = value
        else:
            skipped.append(name)
    return usable, skipped


def set_code(language: str, env: Mapping[str, str]) -> str:
    """Statements that set every variable of ``env`` (empty string when there is none)."""
    return _join(language, (_set(language, name, value) for name, value in env.items()))


def restore_code(
    language: str,
    names: Iterable[str],
    sandbox_env: Mapping[str, str],
    launch_env: Mapping[str, str],
) -> str:
    """Statements that undo a run's variables.

    Each one goes back to the sandbox-global value (envd ``/envs``) when there is one, else to
    the value the kernel was started with, else it is removed. Upstream only knows the first
    and the last case, so it would remove e.g. ``PATH`` after a run that overrode it.
    """
    statements = []
    for name in names:
        if name in sandbox_env:
            statements.append(_set(language, name, sandbox_env[name]))
        elif name in launch_env:
            statements.append(_set(language, name, launch_env[name]))
        else:
            statements.append(_unset(language, name))
    return _join(language, statements)


# Java's environment map is read-only: its backing map is reached by reflection (the kernel's
# JVM opens java.util for it, see _kernels), inside a block so no name is left in the user's JShell.
_JAVA_ENV = (
    "{{ java.util.Map<String, String> e2bView = System.getenv(); "
    'java.lang.reflect.Field e2bField = e2bView.getClass().getDeclaredField("m"); '
    "e2bField.setAccessible(true); "
    '@SuppressWarnings("unchecked") java.util.Map<String, String> e2bEnv = '
    "(java.util.Map<String, String>) e2bField.get(e2bView); {body} }}"
)


def _set(language: str, name: str, value: str) -> str:
    kind = kind_of(language)
    if kind == "python":
        # repr() of a str is always a valid Python literal; __import__ keeps the user's
        # namespace free of an "os" name the user did not import.
        return f'__import__("os").environ[{name!r}] = {value!r}'
    if kind == "deno":
        return f"Deno.env.set({_js_string(name)}, {_js_string(value)});"
    if kind == "r":
        return f"invisible(do.call(Sys.setenv, as.list(c({_r_string(name)} = {_r_string(value)}))))"
    if kind == "java":
        return f"e2bEnv.put({_java_string(name)}, {_java_string(value)});"
    return f"export {name}={_bash_word(value)}"


def _unset(language: str, name: str) -> str:
    kind = kind_of(language)
    if kind == "python":
        return f'__import__("os").environ.pop({name!r}, None)'
    if kind == "deno":
        return f"Deno.env.delete({_js_string(name)});"
    if kind == "r":
        return f"invisible(Sys.unsetenv({_r_string(name)}))"
    if kind == "java":
        return f"e2bEnv.remove({_java_string(name)});"
    return f"unset {name}"


def _join(language: str, statements: Iterable[str]) -> str:
    kind = kind_of(language)
    parts = list(statements)
    if kind == "java":
        return _JAVA_ENV.format(body=" ".join(parts)) if parts else ""
    # bash_kernel waits for a prompt after every line it sends, so bash gets one line.
    return "; ".join(parts) if kind == "bash" else "\n".join(parts)


def _js_string(value: str) -> str:
    """A JavaScript string literal (JSON's, ASCII only: valid in every JavaScript and TypeScript)."""
    return json.dumps(value)


def _is_control(char: str) -> bool:
    return ord(char) < 0x20 or ord(char) == 0x7F


def _escaped(value: str, specials: str, escape: Callable[[str], str | None]) -> str:
    """``value`` with each of ``specials`` after a backslash and other characters as ``escape`` says
    (None: as they are); the body of a literal in the languages below."""
    return "".join("\\" + char if char in specials else escape(char) or char for char in value)


def _r_string(value: str) -> str:
    """An R string literal: backslash and quote escaped, everything outside printable ASCII as \\u{…}."""

    def escape(char: str) -> str | None:
        if 0x20 <= ord(char) < 0x7F:
            return None
        return f"\\u{{{ord(char):04x}}}" if ord(char) <= 0xFFFF else f"\\U{{{ord(char):08x}}}"

    return '"' + _escaped(value, '\\"', escape) + '"'


def _java_string(value: str) -> str:
    """A Java string literal: backslash and quote escaped, control characters as octal escapes.

    Never a \\u escape: Java reads those before it reads the literal, so \\u0022 would end it.
    """
    return '"' + _escaped(value, '\\"', lambda char: f"\\{ord(char):03o}" if _is_control(char) else None) + '"'


def _bash_word(value: str) -> str:
    """One shell word with exactly ``value``: ``shlex.quote`` unless a control character
    (a newline, say) would split the line; then ANSI-C quoting (``$'…'``) keeps it on one."""
    if not any(_is_control(char) for char in value):
        return shlex.quote(value)
    return "$'" + _escaped(value, "\\'", lambda char: f"\\x{ord(char):02x}" if _is_control(char) else None) + "'"
