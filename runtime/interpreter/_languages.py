"""Languages: how a request names one, which ones this template runs, and the statements that
set and restore environment variables inside each kernel.

Sans-IO: tables and pure functions only, table-tested in ``tests/runtime/interpreter``.
The server applies the generated statements as silent executions (``silent=True``,
``store_history=False``), so they never show up in a run's output or execution count.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Final

# Request spelling (after lowercase and trim) → normalized language. These are the aliases the
# upstream server accepts; every other spelling passes through unchanged, and a missing or
# empty language means python. ``typescript`` would run on the javascript kernel upstream.
ALIASES: Final[Mapping[str, str]] = {
    "": "python",
    "js": "javascript",
    "ts": "typescript",
}

# Languages this template has kernels for (bash: the bash_kernel package). Upstream images
# also carry javascript, typescript, r and java kernels; asking for those here is answered
# like upstream answers a language its Jupyter has no kernel for (see unsupported_message).
SUPPORTED_LANGUAGES: Final[tuple[str, ...]] = ("python", "bash")

# Which names each language accepts for an environment variable. Python's os.environ takes
# anything without "=" or NUL; bash's export takes identifiers only. Names outside these are
# skipped (and logged by the caller) rather than turned into statements that fail.
_ENV_NAME: Final[Mapping[str, re.Pattern[str]]] = {
    "python": re.compile(r"[^=\x00]+"),
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


def split_env(language: str, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(usable, skipped names)``: variables a kernel of ``language`` can hold, and the rest."""
    pattern = _ENV_NAME[language]
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


def _set(language: str, name: str, value: str) -> str:
    if language == "python":
        # repr() of a str is always a valid Python literal; __import__ keeps the user's
        # namespace free of an "os" name the user did not import.
        return f'__import__("os").environ[{name!r}] = {value!r}'
    return f"export {name}={_bash_word(value)}"


def _unset(language: str, name: str) -> str:
    if language == "python":
        return f'__import__("os").environ.pop({name!r}, None)'
    return f"unset {name}"


def _join(language: str, statements: Iterable[str]) -> str:
    # bash_kernel waits for a prompt after every line it sends, so bash gets one line.
    return ("\n" if language == "python" else "; ").join(statements)


def _bash_word(value: str) -> str:
    """One shell word with exactly ``value``: ``shlex.quote`` unless a control character
    (a newline, say) would split the line; then ANSI-C quoting (``$'…'``) keeps it on one."""
    if not any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        return shlex.quote(value)
    parts = []
    for char in value:
        if char in "\\'":
            parts.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            parts.append(f"\\x{ord(char):02x}")
        else:
            parts.append(char)
    return "$'" + "".join(parts) + "'"
