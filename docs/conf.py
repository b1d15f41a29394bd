"""Sphinx configuration: MyST Markdown pages, the notebooks rendered from their stored outputs
(myst-nb, never executed here; docs/notebooks holds links to colab/), autodoc API pages (one per
public name, docs/api), and two things generated at build time so they cannot drift: the config
reference (the `config-reference` directive: every --config.SECTION.KEY of the built-in configs,
with its default and meaning) and the pictures of the `priors` builders (`prior-picture`). The
build writes only into its output folder."""
import pathlib
import socket
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

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
nb_merge_streams = True     # a cell's stdout (and stderr) as one block, not one box per write
html_theme = "sphinx_book_theme"
html_title = f"maskprior-jax {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
autosummary_generate = False   # the per-name pages are committed (docs/_generate.py api_pages)
autodoc_default_options = {}   # each page names the members it documents (no dataclass fields)
autodoc_member_order = "bysource"
# Type hints as part of each argument's description, not 20-line signatures.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_preserve_defaults = True
python_use_unqualified_type_names = True
napoleon_google_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True   # Attributes as a field list: no second object description per attribute
# `name` in a docstring links to the documented object of that name.
default_role = "py:obj"
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


PRIOR_PICTURES = "_static/priors"


def _prior_pictures(app):
  """The prior pictures, made into the output folder (the HTML builder's only)."""
  if app.builder.format == "html":
    import _generate
    _generate.prior_pictures(pathlib.Path(app.outdir) / PRIOR_PICTURES)


class ConfigReference(SphinxDirective):
  """The table of every config key, generated from the built-in configs."""

  def run(self):
    import _generate
    box = nodes.container()
    self.state.nested_parse(StringList(_generate.config_table().splitlines(), "config_reference"),
                            self.content_offset, box)
    return box.children


class PriorPicture(SphinxDirective):
  """One prior builder's picture (made by `_prior_pictures` into the output folder)."""
  required_arguments = 1

  def run(self):
    import _generate
    name = self.arguments[0]
    if name not in _generate.PRIOR_EXAMPLES:
      raise self.error(f"no picture for {name!r}; there are {', '.join(_generate.PRIOR_EXAMPLES)}")
    up = "../" * self.env.docname.count("/")
    html = (f'<img src="{up}{PRIOR_PICTURES}/{name}.png" alt="the initial bias of priors.{name}, per head" '
            'style="max-width: 100%">')
    return [nodes.raw("", html, format="html")]


def _project_reference(app, env, node, contnode):
  """A backticked name that names a documented object of this project under another path (a name
  re-exported by `maskprior_jax`, or one written relative to another module) links to that object:
  the documented object with the same last component, preferring the one under the reference's own
  module where several share it."""
  if node.get("refdomain") != "py":
    return None
  from sphinx.util.nodes import make_refnode
  domain = env.get_domain("py")
  target = node["reftarget"].removeprefix("~")
  last = target.rsplit(".", 1)[-1].removesuffix("()")
  matches = [n for n in domain.objects if n.startswith("maskprior_jax") and n.rsplit(".", 1)[-1] == last]
  if len(matches) > 1:
    here = node.get("py:module") or ""
    matches = [n for n in matches if n.startswith(here + ".") and n.count(".") == here.count(".") + 1] or \
        sorted(matches, key=lambda n: n.count("."))[:1]
  if len(matches) != 1:
    return None
  entry = domain.objects[matches[0]]
  return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, matches[0])


def setup(app):
  app.connect("missing-reference", _project_reference)
  app.connect("builder-inited", _prior_pictures)
  app.add_directive("config-reference", ConfigReference)
  app.add_directive("prior-picture", PriorPicture)
