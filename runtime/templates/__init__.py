"""Sandbox templates: root filesystems each sandbox mounts read-only under its overlay.

Why here and why like this: a sandbox starts from a template in well under a second
only if the template already exists, so building one (debootstrap, then the agent
installed from locally built wheels, a minute or two) happens once per content key and
is cached; see ``_build`` for the cache layout and ``_keys`` for what decides a key.

- ``ensure_template("base")`` returns the agent's template, building it if absent;
  ``ensure_template("code-interpreter-v1")`` the same plus Jupyter kernels and the
  interpreter server on port 49999 (its kernels' wheels are locked in ``kernels.*.lock``, their
  Debian packages in ``packages.*.lock``: ``lock_packages`` re-resolves those);
- ``list_templates()`` lists the finished templates in the cache;
- a build reports progress as ``ProgressEvent`` values to any ``Progress`` callable.

Everything that goes wrong is a ``TemplateError`` naming the failing command and ending
with the tail of its output. Building needs root, ``debootstrap`` and ``chroot``; the
Debian mirror is the one apt is configured with (``find_debian_mirror``).
"""

from __future__ import annotations

from ._build import (
    TEMPLATE_MEMORY_MB,
    TEMPLATE_NAMES,
    Template,
    ensure_template,
    import_image,
    list_templates,
    lock_packages,
    prune_templates,
    templates_dir,
)
from ._commands import TemplateError
from ._image_refs import ImageError, ImageReference, RegistrySettings, parse_mirror, parse_reference
from ._images import IMAGE_AGENT, ImageConfig, PulledImage, RegistryCredentials, is_image_template
from ._kernels import WHEEL_LOCKS
from ._kernels import write_lock as write_kernel_lock
from ._keys import AGENT_COMMAND, INTERPRETER_TEMPLATE, base_layer_key, os_layer_key
from ._mirror import Mirror, find_debian_mirror
from ._progress import PlainProgress, Progress, ProgressEvent, RichProgress, default_progress
from ._users import register_user as register_template_user

__all__ = [
    "AGENT_COMMAND",
    "IMAGE_AGENT",
    "INTERPRETER_TEMPLATE",
    "TEMPLATE_MEMORY_MB",
    "TEMPLATE_NAMES",
    "WHEEL_LOCKS",
    "ImageConfig",
    "ImageError",
    "ImageReference",
    "Mirror",
    "PlainProgress",
    "Progress",
    "ProgressEvent",
    "PulledImage",
    "RegistryCredentials",
    "RegistrySettings",
    "RichProgress",
    "Template",
    "TemplateError",
    "base_layer_key",
    "default_progress",
    "ensure_template",
    "find_debian_mirror",
    "import_image",
    "is_image_template",
    "list_templates",
    "lock_packages",
    "os_layer_key",
    "parse_mirror",
    "parse_reference",
    "prune_templates",
    "register_template_user",
    "templates_dir",
    "write_kernel_lock",
]
