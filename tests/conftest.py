"""Shared fixtures: the real artifact store and the folder of the upstream reading material."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract import ArtifactStore

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """``../shared`` beside the checkout (override with ``E2B_COMPAT_SHARED``)."""
    return Path(os.environ.get("E2B_COMPAT_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def store() -> ArtifactStore:
    """The real, content-addressed store: fetches with pip and npm once, then verifies on every use."""
    return ArtifactStore()
