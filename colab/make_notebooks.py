"""Writes the Colab notebooks of this folder from the cell texts below (no outputs).

  python colab/make_notebooks.py                  # rewrite the .ipynb files (outputs dropped)
  python colab/make_notebooks.py --execute        # and run them here, storing the outputs
  python colab/make_notebooks.py --sync           # new cell texts, stored outputs kept (same cells)

`--sync` is for edits that change no result (an import path, a comment); a change in what a
cell computes needs `--execute`. tests/test_notebooks.py checks that the committed notebooks'
cell texts equal the ones below.

The first code cell (`setup`: install, parameters, what was picked) is shared by every notebook. With
MASKPRIOR_SMOKE=1 in the environment, each notebook shrinks its steps and seeds (CI runs
them that way, offline).
"""
import argparse
import pathlib
import tomllib

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
# The repository the Colab badges open and the install cell installs from: pyproject.toml's
# [project.urls] Repository, the one place it is stated (change it there, then run this script
# with --sync).
URL = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
REPO = URL.removeprefix("https://github.com/")


def badge(name: str) -> str:
  return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
          f"(https://colab.research.google.com/github/{REPO}/blob/main/colab/{name})")


def setup(settings: str, configuration: str, requirement: str = "maskprior-jax[bench]"):
  """The first code cell of every notebook: install where missing, the parameters, then one line
  each for the backend and devices and for the configuration the notebook picked. `requirement`:
  the extras (and any other package) the notebook needs, nothing more."""
  name, *others = requirement.split()
  packages = f'"{name} @ " + repository' + "".join(f', "{o}"' for o in others)
  return code(f'''# Setup: install maskprior-jax where it is missing (on Colab; a checkout that has it installed skips
# this), keeping the runtime's own JAX (Colab's GPU or TPU build): the installed jax and jaxlib are
# pinned for pip. Then the parameters. MASKPRIOR_SMOKE=1 (set by CI) shrinks steps, seeds and sizes; the
# code path is the same. MASKPRIOR_REPOSITORY installs from another copy of the repository (a fork, a clone).
import importlib.metadata, importlib.util, os, subprocess, sys, tempfile
if importlib.util.find_spec("maskprior_jax") is None:
    repository = os.environ.get("MASKPRIOR_REPOSITORY", "git+{URL}")
    keep = os.path.join(tempfile.mkdtemp(), "keep_jax.txt")
    with open(keep, "w") as f:
        f.writelines(f"{{p}}=={{importlib.metadata.version(p)}}\\n" for p in ("jax", "jaxlib")
                     if importlib.util.find_spec(p) is not None)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "-c", keep,
                           {packages}])
import jax
SMOKE = os.environ.get("MASKPRIOR_SMOKE") == "1"
ACCELERATOR = jax.default_backend() in ("gpu", "tpu")
{settings.strip()}
print("backend:", jax.default_backend(), "| devices:", jax.devices())
print("configuration:", {configuration})''')


def md(text):
  return nbformat.v4.new_markdown_cell(text.strip())


def code(text):
  return nbformat.v4.new_code_cell(text.strip())


NOTEBOOKS = {}

NOTEBOOKS["01_quickstart.ipynb"] = [
    md(f"""
# Quickstart: a mask prior from a task's structure, and what it does to extrapolation

{badge("01_quickstart.ipynb")}

We take a Boolean task, build the mask prior from which variables interact, train a vanilla
Transformer and a mask-prior Transformer on the *seen* half of the cube, and compare how they
extrapolate to the unseen part. A few minutes on a free CPU runtime.
"""),
    setup('''
STEPS = 60 if SMOKE else 2000      # Adam steps at batch 64, the CLI default's budget''', '"smoke (CI)" if SMOKE else "default", "|", STEPS, "steps at batch 64"'),
    md("""
## The task
`f2_2parity` (Abbe et al., *generalization on the unseen*): n = 15 bits in {-1, +1}, f(x) = x0 x1
(the other 13 bits are irrelevant). Training sees only the points where x0 = 1 or x1 = 1; the
unseen part is x0 = x1 = -1 (1/4 of the cube), where f = +1. A model that fits the seen points
can still extrapolate like the **minimum-degree interpolator** (MDI), -1 + x0 + x1, which predicts
-3 there: a mean squared error of 16 on the unseen part.
"""),
    code('''
import numpy as np, jax.numpy as jnp, matplotlib.pyplot as plt
import maskprior_jax as mp
from maskprior_jax import measure, models, priors, train
from maskprior_jax.bench.boolean import algebra, tasks as boolean
from maskprior_jax.bench.boolean import data as boolean_data

task = boolean.get_task("f2")
mdi = algebra.minimum_degree_interpolator(task)
print(f"{task.name}: n = {task.n}, f = {task.target}, seen: {task.seen}")
print("interaction groups (each monomial's variables):", [list(g) for g in task.groups])
print("MDI's unseen MSE against the truth:", algebra.unseen_mse(task, mdi))'''),
    md("""
## The prior: which positions interact
Token 0 is a CLS token; token i+1 holds bit i. For each monomial's support, one head lets the
CLS token and the members of the support attend inside it (logit 0) and gives every other
pair a logit of -4. This uses only the task's structure (which variables interact), never the
target's values. The prior is a learnable bias `B` in its own `mask_prior` collection.
"""),
    code('''
HEADS = 4
groups = [[i + 1 for i in g] for g in task.groups]            # +1: token 0 is CLS
pattern = priors.group_matrix(groups, task.n + 1, num_heads=HEADS, outside=-4.0, readers=[0])
fig, axes = plt.subplots(1, HEADS, figsize=(12, 3))
for h, ax in enumerate(axes):
    ax.imshow(pattern[h], cmap="viridis"); ax.set_title(f"prior, head {h}"); ax.set_xlabel("key"); ax.set_ylabel("query")
plt.tight_layout(); plt.show()'''),
    md("""
## Two models, one training loop
The same small Transformer (dim 64, depth 2, 4 heads), with and without the prior;
`mp.mask_prior_optimizer` gives the mask its own learning rate (here the base rate);
`train.make_train_step` is the library's jitted step.
"""),
    code('''
seen_x = boolean_data.seen_points(task, np.random.default_rng(0))
seen_ids, seen_y = (seen_x > 0).astype(np.int32), task.f(seen_x).astype(np.float32)

def make_model(mask=None):
    return models.Transformer(vocab_size=2, dim=64, depth=2, num_heads=HEADS, head_dim=16, mlp_dim=128,
                              max_len=task.n, mask=mask)

def fit(model, steps, seed=0):
    variables = model.init(jax.random.key(seed), jnp.zeros((1, task.n), jnp.int32))
    tx = mp.mask_prior_optimizer(3e-4, name="adam")
    loss_fn = lambda v, batch, rng: (jnp.mean((model.apply(v, batch["x"]) - batch["y"]) ** 2), {})
    step = train.make_train_step(loss_fn, tx)
    state = train.create_state(variables, tx, jax.random.key(seed))
    rng, losses = np.random.default_rng(seed), []
    for i in range(steps):
        idx = rng.integers(0, len(seen_ids), 64)
        state, metrics = step(state, {"x": seen_ids[idx], "y": seen_y[idx]})
        losses.append(metrics["loss"])
    return state.variables, np.asarray(jax.device_get(losses))

models_ = {"vanilla": make_model(), "mask": make_model(mp.MaskSettings(priors.from_matrix(pattern)))}
trained, losses = {}, {}
for name, model in models_.items():
    trained[name], losses[name] = fit(model, STEPS)
    print(f"{name}: final training loss {losses[name][-50:].mean():.4f}")'''),
    md("""
## Extrapolation: the whole cube
We evaluate both models on all 2^15 points and measure the mean squared error on the unseen
part, against the truth and against the MDI. Low error against the MDI and high against the
truth means the model learned the minimum-degree rule.
"""),
    code('''
cube = boolean_data.cube(task.n)
ids, unseen = (cube > 0).astype(np.int32), ~task.is_seen(cube)
truth, mdi_values = task.f(cube), mdi(cube)
preds, rows = {}, []
for name, model in models_.items():
    preds[name] = np.asarray(jax.jit(model.apply)(trained[name], ids))
    rows.append((name, np.mean((preds[name] - truth)[~unseen] ** 2), np.mean((preds[name] - truth)[unseen] ** 2),
                 np.mean((preds[name] - mdi_values)[unseen] ** 2)))
# A model fits the seen domain when its seen MSE is at most 1% of f's variance there (the benchmark's
# rule); one that has not fitted says nothing about extrapolation, and is marked so below.
fit_mse = 0.01 * np.var(task.f(seen_x))
fitted = {r[0]: r[1] <= fit_mse for r in rows}
print(f"{'model':8s} {'seen MSE':>10s} {'fitted':>7s} {'unseen MSE vs truth':>20s} {'unseen MSE vs MDI':>18s}")
for r in rows:
    print(f"{r[0]:8s} {r[1]:10.4f} {'yes' if fitted[r[0]] else 'NO':>7s} {r[2]:20.3f} {r[3]:18.3f}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
names = [r[0] + ("" if fitted[r[0]] else "\\n(did not fit)") for r in rows]
axes[0].bar(np.arange(2) - 0.2, [r[2] for r in rows], 0.4, label="vs truth")
axes[0].bar(np.arange(2) + 0.2, [r[3] for r in rows], 0.4, label="vs MDI")
axes[0].axhline(algebra.unseen_mse(task, mdi), ls="--", c="gray", lw=1)
axes[0].set_xticks(range(2), names); axes[0].set_ylabel("unseen MSE"); axes[0].legend()
axes[0].set_title("unseen-domain error (dashed: the MDI's error vs truth)")
series = {"truth": truth, "MDI": mdi_values, **preds}
for i, (label, values) in enumerate(series.items()):
    prof = algebra.degree_profile(algebra.walsh_coefficients(values))[:6]
    axes[1].bar(np.arange(6) + i * 0.2, prof, 0.2, label=label)
axes[1].set_xlabel("degree"); axes[1].set_ylabel("Fourier energy"); axes[1].set_title("degree profiles"); axes[1].legend()
plt.tight_layout(); plt.show()'''),
    md("""
Read the seen MSE first: a model that has not fitted the seen points says nothing about
extrapolation (the table says whether each did). In the run stored in this notebook (2,000 steps,
seed 0) both models fitted the seen domain. The vanilla model's unseen predictions are 0.41 from
the MDI's and 11.3 from the truth: it learned the minimum-degree rule. The mask model is 5.5 from
the truth (a third of the MDI's 16) and 2.7 from the MDI: the prior moved it off the MDI, but not
to the truth. One seed; the README's headline table has five per method (f2: vanilla 0.59, mask
0.26 of the MDI's error).
"""),
    md("""
## Attention after training, next to the prior
Layer 0's attention (averaged over 256 inputs) for each head: the prior's pattern softmax(B0) on
top, the trained mask model below it, the trained vanilla model at the bottom. How much of each
prior head's block structure survives training is what the paper calls persistence.
"""),
    code('''
probe = ids[np.random.default_rng(1).choice(len(ids), 256)]
fig, axes = plt.subplots(3, HEADS, figsize=(12, 8.5))
prior_attn = np.asarray(jax.nn.softmax(jnp.asarray(pattern), -1))
for h in range(HEADS):
    axes[0, h].imshow(prior_attn[h]); axes[0, h].set_title(f"softmax(prior), head {h}")
for row, name in ((1, "mask"), (2, "vanilla")):
    maps = measure.attention_maps(models_[name].apply, trained[name], probe)
    for h in range(HEADS):
        axes[row, h].imshow(np.asarray(maps[0]).mean(0)[h]); axes[row, h].set_title(f"{name}, layer 0, head {h}")
for ax in axes.flat:
    ax.set_xticks([]); ax.set_yticks([])
plt.tight_layout(); plt.show()'''),
    md("""
The full comparison, with the QK-initialized baselines, several seeds and all five tasks, is
`02_boolean_headline.ipynb` (or `maskprior boolean` on the command line).
"""),
]

NOTEBOOKS["02_boolean_headline.ipynb"] = [
    md(f"""
# The Boolean headline: vanilla, mimetic, QK-fitted and mask-prior Transformers on five GOTU tasks

{badge("02_boolean_headline.ipynb")}

Reruns the benchmark behind the README's headline table: unseen-domain error against the truth
and against the minimum-degree interpolator, persistence of each prior, degree profiles.
Small settings on a CPU runtime (about 27 minutes); on a GPU or TPU runtime GOTU's model size
where its projected time fits, with that time printed before anything runs (detected below, not
edited by hand).
"""),
    setup('''
import tempfile
from maskprior_jax.bench import config
from maskprior_jax.bench.boolean import report as boolean_report, run as boolean_run
from maskprior_jax.bench.boolean import tasks as boolean

METHODS = ["vanilla", "mimetic", "qk", "mask"]
if SMOKE:
    cfg = config.apply_overrides(config.builtin_config("boolean"), [
        "--config.train.steps=100", "--config.eval.every_steps=50", "--config.eval.num_points=512",
        "--config.eval.probe_size=32", "--config.qk.fit_steps=20",
        "--config.model.depth=1", "--config.model.dim=16", "--config.model.num_heads=2",
        "--config.model.head_dim=8", "--config.model.mlp_dim=32"])
    TASKS, SEEDS, WORKDIR, PICKED = ["f2_2parity"], [0], tempfile.mkdtemp(), "smoke (CI)"
elif ACCELERATOR:
    # GOTU's size (boolean_paper: dim 256, depth 12, 6 heads, 8,000 steps) where its projected time at
    # 10% of this device's peak is within MAX_HOURS; else the CLI default with 5 seeds. The time is
    # stated here, before anything runs (maskprior_jax.bench.projection: the FLOPs XLA counted for
    # these programs, at 45% and 10% of the device's peak).
    from maskprior_jax.bench import projection
    MAX_HOURS = 2
    kind, count = jax.devices()[0].device_kind, jax.device_count()
    print("boolean_paper headline:", projection.time_statement(projection.PAPER_HEADLINE_FLOP, kind, count))
    peak = projection.peak_for(kind)
    if peak is not None and projection.PAPER_HEADLINE_FLOP / (count * peak * 0.10) <= MAX_HOURS * 3600:
        cfg = config.builtin_config("boolean_paper")
        TASKS, SEEDS, WORKDIR = list(boolean.TASKS), list(range(5)), "runs/boolean_paper_notebook"
        PICKED = "boolean_paper (accelerator)"
    else:    # under a minute of compute on any accelerator; compiling takes most of the time
        cfg = config.builtin_config("boolean")
        TASKS, SEEDS, WORKDIR = list(boolean.TASKS), list(range(5)), "runs/boolean_notebook"
        PICKED = f"boolean (default; the paper size is over {MAX_HOURS} h here or its time is unknown)"
else:    # the CLI headline's model and budget, 2 seeds: about 27 min on 2 CPU cores (docs/notebooks.md)
    cfg = config.builtin_config("boolean")
    TASKS, SEEDS, WORKDIR, PICKED = list(boolean.TASKS), [0, 1], "runs/boolean_notebook", "boolean (CPU default)"''',
          'PICKED, "| tasks:", TASKS, "| seeds:", SEEDS, "| model:", dict(cfg.model), "| steps:", cfg.train.steps'),
    md("""
## Run
Each task trains the four methods with the same model and budget, all seeds of a method in one
vmapped program. Results go to `WORKDIR`; a rerun skips what is finished and resumes an
interrupted method from its checkpoint.
"""),
    code('''
import time
t0 = time.time()
all_results = boolean_run.run_headline(cfg, METHODS, SEEDS, WORKDIR, tasks=TASKS)
print(f"done in {time.time() - t0:.0f} s")'''),
    md("""
## The headline table
Unseen MSE against the truth (and against the MDI), mean ± std over seeds; then persistence:
the mean total-variation distance between attention rows and the prior's pattern softmax(B0) at
the start and end of training, and the mask's relative change.
"""),
    code('''
from IPython.display import Image, Markdown, display
display(Markdown(boolean_report.headline_table(all_results)))
display(Image(f"{WORKDIR}/headline.png"))'''),
    md("""
## Per task: unseen loss during training, persistence, degree profiles
The dashed line in the unseen-loss plot is the MDI's error. The persistence plot shows each
method's attention distance from the prior's pattern over training (in the README's CLI run,
the QK prior started near the pattern and drifted away within 250 steps; the mask prior stayed).
"""),
    code('''
import matplotlib.pyplot as plt, matplotlib.image as mpimg
for name in TASKS:
    display(Markdown(boolean_report.task_table(next(r for r in all_results if r["task"] == name))))
    fig, axes = plt.subplots(1, 3, figsize=(16, 3.6))
    for ax, plot in zip(axes, ("unseen_loss.png", "persistence.png", "degree_profiles.png")):
        ax.imshow(mpimg.imread(f"{WORKDIR}/{name}/{plot}")); ax.axis("off")
    plt.tight_layout(); plt.show()'''),
]

NOTEBOOKS["03_bring_your_own_model.ipynb"] = [
    md(f"""
# Bring your own model: drop `MaskPriorAttention` and the optimizer helper into a Flax model

{badge("03_bring_your_own_model.ipynb")}

A small Transformer written here, outside the library, with Flax's own attention; we swap in
`maskprior_jax.MaskPriorAttention` with a locality prior, train it with the mask frozen and
with its own learning rate, and checkpoint it with orbax.
"""),
    setup('''
STEPS = 40 if SMOKE else 800''', '"smoke (CI)" if SMOKE else "default", "|", STEPS, "steps"',
          requirement="maskprior-jax matplotlib"),
    md("""
## A model of your own
A plain pre-LN encoder whose attention class is a field, so any attention module with Flax's
`MultiHeadDotProductAttention` call signature can be plugged in.
"""),
    code('''
import functools
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax

class TinyEncoder(nn.Module):
    attention: type = nn.MultiHeadDotProductAttention
    vocab: int = 8
    dim: int = 64
    heads: int = 4
    depth: int = 2
    seq: int = 32

    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(self.vocab, self.dim)(tokens)
        h = h + self.param("pos", nn.initializers.normal(0.02), (self.seq, self.dim))
        for i in range(self.depth):
            h = h + self.attention(num_heads=self.heads, name=f"attn_{i}")(nn.LayerNorm()(h))
            h = h + nn.Dense(self.dim)(nn.gelu(nn.Dense(4 * self.dim)(nn.LayerNorm()(h))))
        return nn.Dense(2)(nn.LayerNorm()(h).mean(1))'''),
    md("""
## A task with local structure
Sequences of 32 tokens from 8 symbols; the label says whether at least 4 neighbouring pairs
are equal (x[i] == x[i+1]). Only neighbours interact, so a 1-D locality prior is the task's
structure.
"""),
    code('''
def make_data(n, seed):
    x = np.random.default_rng(seed).integers(0, 8, (n, 32)).astype(np.int32)
    y = ((x[:, 1:] == x[:, :-1]).sum(1) >= 4).astype(np.int32)
    return x, y

train_x, train_y = make_data(4000, 0)
test_x, test_y = make_data(256 if SMOKE else 2000, 1)
print("positive share:", train_y.mean().round(3))'''),
    md("""
## Swap in the mask-prior attention
`MaskPriorAttention` has Flax's parameter names and shapes, so the vanilla model's parameters
fit the new one; the prior `B` (learnable ALiBi, one value per head and offset) is created in the
separate `mask_prior` collection.
"""),
    code('''
import maskprior_jax as mp
from maskprior_jax import priors

local_attention = functools.partial(mp.MaskPriorAttention, mask_init=priors.locality_1d(),
                                    mask_kind="relative_1d", max_len=32)
vanilla, masked = TinyEncoder(), TinyEncoder(attention=local_attention)
v_vars = vanilla.init(jax.random.key(0), train_x[:2])
m_vars = masked.init(jax.random.key(0), train_x[:2])
same = jax.tree.map(lambda a, b: a.shape == b.shape, v_vars["params"], m_vars["params"])
print("same parameter tree and shapes:", all(jax.tree.leaves(same)))
print("mask_prior collection:", jax.tree.map(jnp.shape, m_vars[mp.MASK_PRIOR]))
# The vanilla weights load into the masked model unchanged:
_ = masked.apply({"params": v_vars["params"], mp.MASK_PRIOR: m_vars[mp.MASK_PRIOR]}, train_x[:2])'''),
    md("""
## Train: vanilla, mask frozen, mask with 10x the learning rate
`mp.mask_prior_optimizer` routes the `mask_prior` collection to its own rule: `freeze_mask=True`
keeps it fixed bit for bit (no optimizer state), `mask_lr_multiplier` scales its learning rate.
"""),
    code('''
def train_variant(model, tx, steps=STEPS, seed=0):
    variables = model.init(jax.random.key(seed), train_x[:2])
    opt_state = tx.init(variables)

    @jax.jit
    def step(variables, opt_state, x, y):
        def loss(v):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(v, x), y).mean()
        l, grads = jax.value_and_grad(loss)(variables)
        updates, opt_state = tx.update(grads, opt_state, variables)
        return optax.apply_updates(variables, updates), opt_state, l

    accuracy = jax.jit(lambda v: (model.apply(v, test_x).argmax(-1) == test_y).mean())
    rng, curve, start = np.random.default_rng(seed), [], variables
    for i in range(steps):
        idx = rng.integers(0, len(train_x), 64)
        variables, opt_state, l = step(variables, opt_state, train_x[idx], train_y[idx])
        if (i + 1) % max(steps // 20, 1) == 0:
            curve.append((i + 1, float(accuracy(variables))))
    return start, variables, opt_state, np.array(curve)

variants = {
    "vanilla": (vanilla, mp.mask_prior_optimizer(1e-3, name="adamw", weight_decay=0.01)),
    "mask frozen": (masked, mp.mask_prior_optimizer(1e-3, name="adamw", weight_decay=0.01, freeze_mask=True)),
    "mask lr x10": (masked, mp.mask_prior_optimizer(1e-3, name="adamw", weight_decay=0.01, mask_lr_multiplier=10.0)),
}
runs = {name: train_variant(model, tx) for name, (model, tx) in variants.items()}
for name, (start, end, _, curve) in runs.items():
    line = f"{name:12s} test accuracy {curve[-1, 1]:.3f}"
    if mp.MASK_PRIOR in end:
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start[mp.MASK_PRIOR]),
                                                         jax.tree.leaves(end[mp.MASK_PRIOR])))
        line += f" | mask unchanged bit for bit: {same}"
    print(line)

import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for name, (_, _, _, curve) in runs.items():
    axes[0].plot(curve[:, 0], curve[:, 1], label=name)
axes[0].set(xlabel="step", ylabel="test accuracy", title="training"); axes[0].legend()
b0 = np.asarray(jax.tree.leaves(runs["mask lr x10"][0][mp.MASK_PRIOR])[0])
b1 = np.asarray(jax.tree.leaves(runs["mask lr x10"][1][mp.MASK_PRIOR])[0])
offsets = np.arange(b0.shape[1]) - (b0.shape[1] - 1) // 2
for h in range(b0.shape[0]):
    axes[1].plot(offsets, b0[h], ls="--", c=f"C{h}")
    axes[1].plot(offsets, b1[h], c=f"C{h}", label=f"head {h}")
axes[1].set(xlabel="key offset k - q", ylabel="bias", title="layer 0 prior: start (dashed) and learned (mask lr x10)")
axes[1].legend(fontsize=8); plt.tight_layout(); plt.show()'''),
    md("""
## Checkpoint with orbax
The variables (weights and mask prior) and the optimizer state are one pytree; orbax saves and
restores it exactly.
"""),
    code('''
import tempfile, pathlib
import orbax.checkpoint as ocp

_, variables, opt_state, _ = runs["mask lr x10"]
state = {"variables": variables, "opt_state": opt_state}
path = pathlib.Path(tempfile.mkdtemp()) / "state"
with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, state)
    ckptr.wait_until_finished()
    restored = ckptr.restore(path, jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
equal = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)))
print("restored state equals the saved one:", equal)
print("mask prior restored:", jax.tree.map(jnp.shape, restored["variables"][mp.MASK_PRIOR]))'''),
]

NOTEBOOKS["04_vision_language.ipynb"] = [
    md(f"""
# Vision and language: locality mask priors against vanilla and QK initializations

{badge("04_vision_language.ipynb")}

Trains a small ViT with a learnable 2-D locality prior and a byte-level causal LM with a
learnable 1-D recency prior, each against vanilla, mimetic and QK-fitted initializations. On
Colab the vision part loads MNIST through TFDS; offline (and in CI) it uses the 8x8 digits
that ship with scikit-learn. **The outputs stored in this notebook come from a CPU run outside
Colab, so they show the embedded digits, not MNIST.** The LM reads Python's own help topics
(`pydoc_data`), shipped with CPython.
"""),
    setup('''
import tempfile
from maskprior_jax.bench import config, supervised_report
from maskprior_jax.bench.language import run as language_run
from maskprior_jax.bench.vision import run as vision_run

IN_COLAB = "google.colab" in sys.modules
# MNIST through TFDS on Colab, the embedded digits elsewhere; MASKPRIOR_VISION_DATASET and
# MASKPRIOR_TFDS_DIR pick another TFDS dataset and folder (CI: one built offline, to test this path).
DATASET = os.environ.get("MASKPRIOR_VISION_DATASET") or ("mnist" if IN_COLAB and not SMOKE else "digits")
DATA_DIR = os.environ.get("MASKPRIOR_TFDS_DIR") or ("/content/tensorflow_datasets" if IN_COLAB else "")
METHODS = ["vanilla", "mimetic", "qk", "mask"]
SEEDS = [0] if SMOKE else [0, 1]
steps = ["--config.train.steps=50", "--config.eval.every_steps=25", "--config.train.steps_per_call=25",
         "--config.qk.fit_steps=10", "--config.model.depth=1", "--config.model.dim=32",
         "--config.model.num_heads=2", "--config.model.head_dim=16", "--config.model.mlp_dim=64"] if SMOKE else []
WORKDIR = tempfile.mkdtemp() if SMOKE else "runs/vision_language_notebook"''',
          '"smoke (CI)" if SMOKE else "default", "| vision dataset:", DATASET, "| seeds:", SEEDS',
          requirement="maskprior-jax[data]"),
    md("""
## Vision data
On Colab, TFDS downloads MNIST once and writes it as array_record files, which the benchmark
reads through `tfds.data_source` (no TensorFlow needed). The 28x28 images become a 7x7 grid of
4x4 patches; the 8x8 digits a 4x4 grid of 2x2 patches.
"""),
    code('''
if DATASET != "digits":
    import tensorflow_datasets as tfds
    tfds.builder(DATASET, data_dir=DATA_DIR, file_format="array_record").download_and_prepare()
vision_cfg = config.apply_overrides(config.builtin_config("vision"), [
    f"--config.data.dataset={DATASET}", f"--config.data.data_dir={DATA_DIR}",
    f"--config.data.patch={4 if DATASET == 'mnist' else 2}", *steps])
print(vision_cfg.model, vision_cfg.prior, sep="\\n")'''),
    md("""
## Train the ViT: four methods, same model and budget
`mask`: a per-head distance-decay prior over the patch grid, stored as a learnable table of 2-D
offsets. `qk`: query/key weights fitted so the initial attention matches the same pattern.
"""),
    code('''
from IPython.display import Image, Markdown, display
vision = vision_run.run(vision_cfg, METHODS, SEEDS, f"{WORKDIR}/vision")
display(Markdown(supervised_report.table(vision)))
display(Image(f"{WORKDIR}/vision/test_curve.png")); display(Image(f"{WORKDIR}/vision/persistence.png"))'''),
    md("""
## The byte-level LM with a recency prior
ALiBi's per-head slopes as the initial bias, one learnable value per head and offset. Bits per
character on held-out text; the dashed line is the unigram entropy a model must beat.
"""),
    code('''
lm_steps = steps if SMOKE else ["--config.train.steps=600", "--config.eval.every_steps=100"]
language_cfg = config.apply_overrides(config.builtin_config("language"), lm_steps)
language = language_run.run(language_cfg, METHODS, [0], f"{WORKDIR}/language")
display(Markdown(supervised_report.table(language)))
display(Image(f"{WORKDIR}/language/test_curve.png")); display(Image(f"{WORKDIR}/language/persistence.png"))'''),
    md("""
The command-line versions, with the full CPU budget, are `maskprior vision` and `maskprior language`
(the four methods, 3 seeds); the README holds their results at 5 seeds with the controls
(`--methods ...,bias_zero` in both, `alibi` in language).
"""),
]


def sync(only=None) -> None:
  """Put the cell texts below into the committed notebooks, keeping their stored outputs."""
  for name, cells in NOTEBOOKS.items():
    if only and name not in only:
      continue
    nb = nbformat.read(HERE / name, as_version=4)
    if [c.cell_type for c in nb.cells] != [c.cell_type for c in cells]:
      raise SystemExit(f"{name}: the cells changed in number or kind; rerun with --execute")
    for old, new in zip(nb.cells, cells):
      old.source = new.source
    nbformat.write(nb, HERE / name)
    print("synced", HERE / name)


def write(execute: bool, only=None) -> None:
  for name, cells in NOTEBOOKS.items():
    if only and name not in only:
      continue
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}, "colab": {"provenance": []}})
    if execute:
      from nbclient import NotebookClient
      NotebookClient(nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(HERE.parent)}}).execute()
    nbformat.write(nb, HERE / name)
    print("wrote", HERE / name)


if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--execute", action="store_true")
  p.add_argument("--sync", action="store_true")
  p.add_argument("--only", nargs="*")
  a = p.parse_args()
  if a.sync:
    sync(a.only)
  else:
    write(a.execute, a.only)
