"""Sphinx configuration: MyST Markdown pages, the notebooks rendered from their stored outputs
(myst-nb, never executed here), autodoc/autosummary API pages, and two pages generated at build
time so they cannot drift: the config reference (every --config.SECTION.KEY of the built-in configs,
with its default and meaning) and the pictures of the `priors` builders."""
import pathlib
import shutil
import socket
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS))

import maskprior_jax  # noqa: E402

project = "maskprior-jax"
author = "the maskprior-jax authors"
copyright = "the maskprior-jax authors; Apache-2.0"   # noqa: A001
version = release = maskprior_jax.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.intersphinx", "sphinx.ext.viewcode"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "results/generated/REBUILD.sh", "**.ipynb_checkpoints"]
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
nb_execution_mode = "off"   # the notebooks show the outputs stored in colab/*.ipynb
html_theme = "sphinx_book_theme"
html_title = f"maskprior-jax {release}"
html_static_path = ["_static"]
autosummary_generate = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
# Pages link to repository files that are not documents (configs, run folders); those stay as
# text and code paths, and the notebooks' cell outputs may hold mimetypes the HTML builder skips.
suppress_warnings = ["mystnb.unknown_mime_type"]

INTERSPHINX = {"python": ("https://docs.python.org/3", None), "jax": ("https://docs.jax.dev/en/latest/", None),
               "flax": ("https://flax.readthedocs.io/en/latest/", None),
               "optax": ("https://optax.readthedocs.io/en/latest/", None)}


def _online(host: str = "docs.python.org") -> bool:
  try:
    socket.create_connection((host, 443), timeout=2).close()
    return True
  except OSError:
    return False


# Cross-links to JAX, Flax and Optax where their inventories can be fetched; an offline build (CI
# here) keeps plain names instead of failing on the fetch.
intersphinx_mapping = INTERSPHINX if _online() else {}


def _generate(app):
  import _generate
  _generate.config_reference(DOCS / "guides" / "_config_reference.md")
  _generate.prior_pictures(DOCS / "_static" / "priors")
  nb = DOCS / "notebooks"
  nb.mkdir(exist_ok=True)
  for src in sorted((ROOT / "colab").glob("*.ipynb")):
    shutil.copyfile(src, nb / src.name)


def _rst_ok(text: str) -> bool:
  """Whether plain docutils reads `text` without a warning."""
  import io

  from docutils.core import publish_doctree
  stream = io.StringIO()
  try:
    publish_doctree(text, settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": stream})
  except Exception:   # Sphinx's own roles need its environment: such text was written as reST
    return True
  return not stream.getvalue()


def _docstring(app, what, name, obj, options, lines):
  """The library's docstrings are plain text laid out for `help()` ("name: meaning" lines with
  hanging indents). One that is not valid reStructuredText as written (after napoleon) is shown as
  written, in a preformatted block, instead of being mangled or failing the build."""
  text = "\n".join(lines)
  if lines and not _rst_ok(text):
    lines[:] = ["::", ""] + ["   " + line for line in lines] + [""]


def setup(app):
  app.connect("builder-inited", _generate)
  app.connect("autodoc-process-docstring", _docstring)
