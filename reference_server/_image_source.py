"""Where a ``from_image`` build's bottom layer comes from: the runtime's registry pull, behind a seam.

``RegistryImages`` pulls through ``runtime.templates.import_image`` (skopeo and umoci, pinned by
digest, the operator's mirrors) in a worker thread and passes its progress lines to the build
log as they come. Unit tests give the builder an ``ImageSource`` of their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime.templates import RegistryCredentials, RegistrySettings, TemplateError, import_image

__all__ = ["ImageSource", "ImageSourceError", "PulledBase", "RegistryImages", "Say"]

Say = Callable[[str], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class PulledBase:
    layer: str  # the template name backends are given
    digest: str
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    cached: bool


class ImageSourceError(Exception):
    """The image could not be pulled; the message is safe for the build log."""


class ImageSource(Protocol):
    async def pull(self, reference: str, credentials: RegistryCredentials | None, say: Say) -> PulledBase:
        """The image as a template backends can run; ``ImageSourceError`` when it cannot be had."""
        ...


class RegistryImages:
    def __init__(self, registries: RegistrySettings, *, cache_root: Path | None = None) -> None:
        self._registries = registries
        self._cache_root = cache_root

    async def pull(self, reference: str, credentials: RegistryCredentials | None, say: Say) -> PulledBase:
        loop = asyncio.get_running_loop()
        pending: list[concurrent.futures.Future[None]] = []

        def from_thread(line: str) -> None:
            pending.append(asyncio.run_coroutine_threadsafe(say(line), loop))

        try:
            pulled = await asyncio.to_thread(
                import_image,
                reference,
                registries=self._registries,
                credentials=credentials,
                cache_root=self._cache_root,
                say=from_thread,
            )
        except TemplateError as exc:
            raise ImageSourceError(str(exc)) from None
        finally:
            for future in pending:
                await asyncio.wrap_future(future)
        return PulledBase(
            layer=pulled.name,
            digest=pulled.digest,
            env=pulled.config.env,
            workdir=pulled.config.workdir,
            cached=pulled.cached,
        )
