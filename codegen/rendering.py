"""Rendering: a config -> CUDA source, through its family's Jinja2 template."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jinja2

from codegen.errors import GemmTuneError
from codegen.families import Config, family_of

__all__ = ["render", "render_file", "render_string", "template_dir", "template_hash"]


@functools.cache
def template_dir() -> Path:
    """The templates: installed as codegen/templates, or templates/ beside codegen/ in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "macros.cu.j2").is_file():
            return candidate
    raise FileNotFoundError(f"gemm-tune's templates are missing (looked beside {here})")


@functools.cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(config: Config) -> str:
    """CUDA source of one configuration (no validation: call codegen.check first)."""
    template = family_of(config).template
    if template is None:
        raise GemmTuneError(f"the {family_of(config).name} family renders no source")
    return _env().get_template(template).render(**config.template_values())


def render_file(template: str, **values) -> str:
    """Render any template under templates/ (the export bundle's, for instance)."""
    return _env().get_template(template).render(**values)


def render_string(source: str, **values) -> str:
    """Render a template given as text, with templates/ (and its macros) to import from."""
    return _env().from_string(source).render(**values)


@functools.cache
def template_hash() -> str:
    """sha256 (first 16 hex digits) over the kernel templates (templates/*.j2, not the
    export bundle's): part of every cache key."""
    h = hashlib.sha256()
    for path in sorted(template_dir().glob("*.j2")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
