"""The Boolean extrapolation benchmark: train vanilla / mimetic / qk / mask models on the
seen domain of a GOTU task, then measure extrapolation, degree profiles and persistence.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md and PNG plots.
Each method's results are written as soon as it finishes; rerunning the same command
with the same workdir skips finished methods.
"""
from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maskprior_jax import priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import methods as methods_lib
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.boolean import mechanism
from maskprior_jax.bench.boolean import tasks as boolean
from maskprior_jax.bench.config import ConfigError, check, config_digest
from maskprior_jax.distributed import take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

METHODS = methods_lib.METHODS


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Every value the benchmark reads, checked before any work starts (ConfigError names it)."""
  check(cfg, choices={"model.pos_embedding": ("learned", "sinusoidal", "none"), "model.pos_where": ("input", "qk"),
                      "prior.pos_embedding": ("model", "learned", "sinusoidal", "none"),
                      "prior.mode": ("learned", "frozen"), "prior.layers": ("all", "first", "layered"),
                      "prior.token_rows": ("group", "self", "noself"), "prior.spare_heads": ("cycle", "union"),
                      "train.optimizer": ("adam", "adamw", "sgd")},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim", "train.steps",
                  "train.batch_size", "train.steps_per_call", "eval.every_steps", "eval.num_points",
                  "eval.probe_size", "train.learning_rate", "eval.fit_threshold"])
  learning_rate(cfg, "")
  task_sizes(cfg)


def _by_task(cfg, key: str, cast) -> dict:
  """Parse a "task=value,task=value" config string (train.learning_rate_by_task, task.n_by_task)."""
  section, name = key.split(".")
  out = {}
  for item in filter(None, (i.strip() for i in cfg[section][name].split(","))):
    task, sep, value = item.partition("=")
    task = boolean.ALIASES.get(task.strip(), task.strip())
    try:
      if not sep or task not in boolean.TASKS:
        raise ValueError
      out[task] = cast(value)
    except ValueError:
      raise ConfigError(f"{key}: bad entry {item!r}; use task=value,task=value with tasks "
                        f"from {', '.join(boolean.TASKS)}") from None
  return out


def task_sizes(cfg) -> dict:
  """task.n_by_task: the dimension n of a built-in task where the config changes it."""
  sizes = _by_task(cfg, "task.n_by_task", int)
  for name, n in sizes.items():
    try:
      boolean.resized(boolean.TASKS[name], n)
    except boolean.TaskSpecError as e:
      raise ConfigError(f"task.n_by_task: {e}") from None
  return sizes


def headline_tasks(cfg) -> dict:
  """The five GOTU tasks at the config's sizes."""
  sizes = task_sizes(cfg)
  return {name: boolean.resized(t, sizes[name]) if name in sizes else t for name, t in boolean.TASKS.items()}


def prior_pattern(task: boolean.Task, cfg: ml_collections.ConfigDict, layer: int = 0) -> np.ndarray:
  """(heads, n+1, n+1) logit bias from the task's interaction groups; token 0 is CLS.

  prior.token_rows: "group" (a variable token attends inside its groups, itself included),
  "noself" (to the other members of its groups, not itself), "self" (only itself).
  prior.layers="layered": layer 0 holds the token rows only (CLS attends to itself), later layers
  the CLS rows only (variable tokens attend to themselves)."""
  groups = [[i + 1 for i in g] for g in task.groups]
  rows = cfg.prior.token_rows
  layered = cfg.prior.layers == "layered"
  return priors.group_matrix(groups, task.n + 1, num_heads=cfg.model.num_heads if cfg.prior.per_head else None,
                             inside=cfg.prior.inside, outside=cfg.prior.outside,
                             readers=[] if layered and layer == 0 else [0],
                             member_rows=rows != "self" and not (layered and layer > 0),
                             member_self=rows != "noself", spare_heads=cfg.prior.spare_heads)


def build_model(task: boolean.Task, cfg: ml_collections.ConfigDict, method: str) -> Transformer:
  mask = None
  if method == "mask":
    mask = MaskSettings(priors.from_matrix(prior_pattern(task, cfg)))
    if cfg.prior.layers == "first":
      mask = [mask] + [None] * (cfg.model.depth - 1)
    elif cfg.prior.layers == "layered":
      mask = [MaskSettings(priors.from_matrix(prior_pattern(task, cfg, layer))) for layer in range(cfg.model.depth)]
  m = cfg.model
  # The mask method may drop positions (prior.pos_embedding): its prior tells variables apart by
  # itself. The other methods keep model.pos_embedding; without positions they could not.
  pos = cfg.prior.pos_embedding if method == "mask" and cfg.prior.pos_embedding != "model" else m.pos_embedding
  return Transformer(vocab_size=2, dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim,
                     mlp_dim=m.mlp_dim, max_len=task.n, pos_embedding=pos,
                     pos_where=m.pos_where, pooling="cls", head="regression", mask=mask,
                     attention_implementation=m.get("attention"))


def to_ids(x: np.ndarray) -> np.ndarray:
  """{-1,+1} bits -> token ids {0, 1}."""
  return (np.asarray(x) > 0).astype(np.int32)


def learning_rate(cfg, task_name: str) -> float:
  """train.learning_rate, unless train.learning_rate_by_task ("task=lr,task=lr") names the task."""
  return _by_task(cfg, "train.learning_rate_by_task", float).get(task_name, cfg.train.learning_rate)


def _relevant_profile(task: boolean.Task, g) -> list[float]:
  """Degree profile of g over the relevant variables' cube (g reads only those)."""
  _, full = boolean._relevant_points(task)
  return boolean.degree_profile(boolean.walsh_coefficients(g(full))).tolist()


def _predict(model, stacked, ids, chunk=8192):
  fn = jax.jit(jax.vmap(lambda v, x: model.apply(v, x), in_axes=(0, None)))
  return np.concatenate([np.asarray(fn(stacked, ids[i:i + chunk])) for i in range(0, len(ids), chunk)], 1)


def run_task(task: boolean.Task, cfg: ml_collections.ConfigDict, methods: Sequence[str],
             seeds: Sequence[int], workdir: pathlib.Path, log=print, progress=None) -> dict:
  """Train every method on the task's seen domain for every seed not yet in `workdir`, and
  measure extrapolation, fit, mechanism and persistence. `progress` (`results.RunProgress`)
  counts finished method runs."""
  validate(cfg)
  workdir = pathlib.Path(workdir)
  mdi = boolean.minimum_degree_interpolator(task)
  mdi_unseen = boolean.unseen_mse(task, mdi)
  results_path = workdir / "results.json"
  rng = np.random.default_rng(0)
  seen_x = boolean.seen_points(task, rng)
  seen_ids = to_ids(seen_x)
  seen_f = task.f(seen_x).astype(np.float32)
  # A method fits the seen domain when its seen MSE is below this share of f's variance there.
  fit_mse = cfg.eval.fit_threshold * float(np.var(seen_f.astype(np.float64)))
  mech = mechanism.describe(task, mdi)
  digest = config_digest({"cfg": cfg.to_dict(), "task": [task.target, task.seen, task.n]})
  results = results_lib.open_results(workdir, cfg, digest, "boolean", {
      "task": task.name, "n": task.n, "target": task.target, "seen": task.seen,
      "groups": [list(g) for g in task.groups], "mdi": mdi.pretty(), "mdi_unseen_mse_true": mdi_unseen,
      "fit_threshold_seen_mse": fit_mse, "mechanism": mech,
      "truth_degree_profile": _relevant_profile(task, task.f),
      "mdi_degree_profile": _relevant_profile(task, mdi)})

  full = task.n <= cfg.eval.full_cube_max_n
  test_x = boolean.cube(task.n) if full else (1 - 2 * rng.integers(0, 2, (1 << 16, task.n))).astype(np.int8)
  test_seen = task.is_seen(test_x)
  test_f = task.f(test_x)
  test_mdi = mdi(test_x)
  # A fixed subset for curves during training: half unseen, half seen points.
  ev_rng = np.random.default_rng(1)
  half = cfg.eval.num_points // 2
  ev_idx = np.concatenate([ev_rng.choice(np.flatnonzero(~test_seen), half),
                           ev_rng.choice(np.flatnonzero(test_seen), half)])
  ev_ids, ev_f, ev_mdi, ev_unseen = to_ids(test_x[ev_idx]), test_f[ev_idx], test_mdi[ev_idx], ~test_seen[ev_idx]
  probe_ids = to_ids(test_x[ev_rng.choice(len(test_x), cfg.eval.probe_size)])
  pattern = prior_pattern(task, cfg)
  target_attn = target_attention(pattern)
  by, keys = mechanism.unseen_groups(task)
  group_of = mechanism.group_ids(task, test_x, by, keys)

  for method in methods:
    todo = results_lib.seeds_to_run(results, method, seeds)
    if not todo:
      log(f"[{task.name}] {method}: seeds {list(seeds)} already in {results_path}, skipped")
      if progress is not None:
        progress.skip()
      continue
    t_method = results_lib.Timer()
    model = build_model(task, cfg, method)
    bs = cfg.train.batch_size

    def loss_fn(v, batch, rng):
      del rng
      pred = model.apply(v, batch["x"])
      return jnp.mean((pred - batch["y"]) ** 2), {}

    def batch_fn(step, seeds, part=(0, 1)):   # part: (i, n), share i of n of the rows (see train_seeds)
      idx = np.stack([take_part(np.random.default_rng([s, step]).integers(0, len(seen_ids), bs), part)
                      for s in seeds])
      return {"x": seen_ids[idx], "y": seen_f[idx]}

    run_seeds = np.asarray(todo, np.int32)

    def device_batch_fn(step, run, run_seeds=run_seeds):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seeds)[run]), step)
      idx = jax.random.randint(key, (bs,), 0, len(seen_ids))
      return {"x": jnp.asarray(seen_ids)[idx], "y": jnp.asarray(seen_f)[idx]}

    def metrics_fn(v, data):
      del data
      pred = model.apply(v, ev_ids)
      err_t, err_m = (pred - ev_f) ** 2, (pred - ev_mdi) ** 2
      return {"unseen_mse_true": err_t[ev_unseen].mean(), "unseen_mse_mdi": err_m[ev_unseen].mean(),
              "seen_mse": err_t[~ev_unseen].mean()}

    state, history, infos, _ = methods_lib.train_method(
        method=method, model=model, tx=methods_lib.make_tx(cfg, learning_rate(cfg, task.name)), cfg=cfg, seeds=todo,
        sample_input=jnp.zeros((1, task.n), jnp.int32), probe_input=probe_ids, target_attn=target_attn,
        loss_fn=loss_fn, batch_fn=batch_fn, device_batch_fn=device_batch_fn, metrics_fn=metrics_fn,
        label=f"{task.name}/{method}",
        checkpoint_dir=workdir / "checkpoints" / method / results_lib.seeds_dir(todo),
        tensorboard_dir=workdir / "tensorboard" / method / results_lib.seeds_dir(todo))

    pred = _predict(model, state.variables, to_ids(test_x))
    for i, seed in enumerate(todo):
      p = pred[i]
      seen_mse = float(np.mean((p - test_f)[test_seen] ** 2))
      metrics = {"seen_mse": seen_mse, "fitted": seen_mse <= fit_mse,
                 "unseen_group_means": mechanism.group_means(p.astype(np.float64), group_of, len(mech["groups"])),
                 "unseen_mse_true": float(np.mean((p - test_f)[~test_seen] ** 2)),
                 "unseen_mse_mdi": float(np.mean((p - test_mdi)[~test_seen] ** 2)),
                 "degree_profile": boolean.degree_profile(boolean.walsh_coefficients(p)).tolist() if full else None}
      results["runs"].append(methods_lib.run_record(method, seed, i, state, history, infos, metrics).to_json())
    results_lib.record_method(results, method, history, t_method(), workdir, run_labels=todo)
    done = [r for r in results["runs"] if r["method"] == method and r["seed"] in todo]
    log(f"[{task.name}] {method}: seeds {todo}: unseen MSE / MDI's "
        + ", ".join(f"{mdi_share(r['unseen_mse_true'], mdi_unseen):.2f}" if r["fitted"] else "did not fit" for r in done)
        + f" ({t_method():.0f}s)")
    if progress is not None:
      progress.done()

  write_task_report(results, workdir)
  return results


def mdi_share(unseen_mse: float, mdi_unseen_mse: float) -> float:
  """Unseen MSE as a share of the MDI's (0 = the truth, 1 = the MDI); NaN where the MDI is exact."""
  return unseen_mse / mdi_unseen_mse if mdi_unseen_mse > 0 else float("nan")


BAR = 0.10   # the paper's bar: unseen MSE at most 10% of the MDI's is "near-perfect" extrapolation


def summarize(results: dict) -> list[dict]:
  """Per method: per-seed values (in seed order), fit status, and the persistence endpoints."""
  rows = []
  ref = results["mdi_unseen_mse_true"]
  for m in results_lib.methods_in(results):
    runs = sorted((r for r in results["runs"] if r["method"] == m), key=lambda r: r["seed"])
    last = lambda r, k: r["persistence"][-1].get(k)
    fitted = [r for r in runs if r["fitted"]]
    rows.append({"method": m, "seeds": [r["seed"] for r in runs], "fitted": [r["fitted"] for r in runs],
                 "seen_mse": [r["seen_mse"] for r in runs],
                 "ratio": [mdi_share(r["unseen_mse_true"], ref) for r in runs],
                 "ratio_fitted": [mdi_share(r["unseen_mse_true"], ref) for r in fitted],
                 "unseen_mse_true": [r["unseen_mse_true"] for r in fitted],
                 "unseen_mse_mdi": [r["unseen_mse_mdi"] for r in fitted],
                 "tv0": [float(np.mean(r["persistence"][0]["attn_tv"])) for r in runs],
                 "tv_end": [float(np.mean(last(r, "attn_tv"))) for r in runs],
                 "drift_end": [last(r, "mask_drift") for r in runs if last(r, "mask_drift") is not None]})
  return rows


def _per_seed(s: dict) -> str:
  return ", ".join(f"{v:.2f}" if ok else "did not fit" for v, ok in zip(s["ratio"], s["fitted"]))


def _fit_cell(s: dict, key: str = "ratio_fitted", fmt=lambda v: results_lib.mean_std(v)) -> str:
  """mean ± std over the fitted seeds, or "did not fit" when none did."""
  if not s[key]:
    return "did not fit"
  return fmt(s[key])


def task_table(results: dict) -> str:
  ref = results["mdi_unseen_mse_true"]
  header = ["method", "fitted / seeds", "seen MSE", "unseen MSE vs truth", "unseen / MDI's", "per seed (unseen / MDI's)",
            "unseen MSE vs MDI", "attn TV start → end", "‖B−B0‖/‖B0‖ end"]
  rows = []
  for s in summarize(results):
    rows.append([s["method"], f"{sum(s['fitted'])}/{len(s['seeds'])}", results_lib.mean_std(s["seen_mse"]),
                 _fit_cell(s, "unseen_mse_true"), _fit_cell(s), _per_seed(s), _fit_cell(s, "unseen_mse_mdi"),
                 f"{np.mean(s['tv0']):.2f} → {np.mean(s['tv_end']):.2f}",
                 results_lib.mean_std(s["drift_end"]) if s["drift_end"] else "-"])
  mech = results["mechanism"]
  head = (f"**{results['task']}** (n = {results['n']}): f = `{results['target']}`, seen: `{results['seen']}`; "
          f"MDI = `{results['mdi']}`, MDI's unseen MSE vs truth = {ref:.4g}. Seeds {_seed_list(results)}; "
          f"a run fits when its seen MSE ≤ {results['fit_threshold_seen_mse']:.3g}; only fitted runs are scored.\n\n")
  out = head + results_lib.markdown_table(header, rows)
  out += ("\nReference interpolants from the structure alone (unseen MSE / MDI's): span of the support monomials "
          f"{mdi_share(mech['support_lsq_unseen_mse'], ref):.3f}, per-support count lookup "
          f"{mdi_share(mech['count_lookup_unseen_mse'], ref):.3f}.\n")
  return out + "\n" + mechanism_table(results) + "\n" + degree_table(results)


def _seed_list(results: dict) -> str:
  seeds = sorted({r["seed"] for r in results["runs"]})
  return ", ".join(map(str, seeds)) if seeds else "-"


def mechanism_table(results: dict) -> str:
  """Mean prediction on each group of unseen points: truth, MDI, the two references, each method
  (mean over its fitted seeds)."""
  mech = results["mechanism"]
  methods = [s["method"] for s in summarize(results)]
  header = [f"unseen group ({mech['by']})", "share of unseen", "truth", "MDI", "support LSQ", "count lookup"] + methods
  rows = []
  total = sum(mech["size"])
  for g, label in enumerate(mech["groups"]):
    row = [label, f"{mech['size'][g] / total:.1%}"] + [f"{mech[k][g]:.2f}" for k in ("truth", "mdi", "support_lsq", "count_lookup")]
    for m in methods:
      vals = [r["unseen_group_means"][g] for r in results["runs"] if r["method"] == m and r["fitted"]]
      row.append(results_lib.mean_std(vals) if vals else "did not fit")
    rows.append(row)
  return "Mean prediction on the unseen points, by group:\n\n" + results_lib.markdown_table(header, rows)


def degree_table(results: dict) -> str:
  """Degree profile (sum of f̂(S)² by |S|) of the truth, the MDI and each method (mean over all seeds)."""
  truth, mdi = np.asarray(results["truth_degree_profile"]), np.asarray(results["mdi_degree_profile"])
  top = max(int(np.flatnonzero(truth > 1e-9).max()), int(np.flatnonzero(mdi > 1e-9).max())) + 1
  truth, mdi = (np.pad(v, (0, max(0, top + 1 - len(v)))) for v in (truth, mdi))
  rows = [["truth"] + [f"{v:.3f}" for v in truth[:top + 1]], ["MDI"] + [f"{v:.3f}" for v in mdi[:top + 1]]]
  for m in results_lib.methods_in(results):
    prof = [r["degree_profile"] for r in results["runs"] if r["method"] == m and r.get("degree_profile")]
    if prof:
      mean = np.mean(np.asarray(prof)[:, :top + 1], 0)
      rows.append([m] + [f"{v:.3f}" for v in mean])
  return "Degree profile (energy by degree):\n\n" + results_lib.markdown_table(
      ["function"] + [f"degree {d}" for d in range(top + 1)], rows)


def write_task_report(results: dict, workdir: pathlib.Path) -> None:
  if not results_lib.is_main_process():   # process 0 writes the report
    return
  workdir = pathlib.Path(workdir)
  (workdir / "table.md").write_text(task_table(results))
  curves = results["curves"]
  if not curves:
    return
  results_lib.plot_curves(workdir / "unseen_loss.png", results_lib.metric_curves(curves, "unseen_mse_true"),
                         title=f"{results['task']}: unseen MSE vs truth", ylabel="MSE", logy=True,
                         hlines={"MDI": results["mdi_unseen_mse_true"]})
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['task']}: attention distance from the prior's pattern",
                         ylabel="mean TV distance (layers)")
  drift = results_lib.metric_curves(curves, "mask_drift")
  if drift:
    results_lib.plot_curves(workdir / "mask_drift.png", drift, title=f"{results['task']}: ‖B_t − B_0‖ / ‖B_0‖",
                           ylabel="relative change")
  plot_degree_profiles(results, workdir / "degree_profiles.png")


def plot_degree_profiles(results: dict, path: pathlib.Path) -> None:
  profiles = {}
  for r in results["runs"]:
    if r.get("degree_profile") is not None:
      profiles.setdefault(r["method"], []).append(r["degree_profile"])
  if not profiles:
    return
  truth, mdi = np.asarray(results["truth_degree_profile"]), np.asarray(results["mdi_degree_profile"])
  maxdeg = max(int(np.max(np.flatnonzero(truth > 1e-6))), int(np.max(np.flatnonzero(mdi > 1e-6)))) + 2
  pad = lambda v: np.pad(v, (0, max(0, maxdeg - len(v))))
  truth, mdi = pad(truth), pad(mdi)
  series = {"truth": truth, "MDI": mdi, **{m: np.mean(v, 0) for m, v in profiles.items()}}
  fig, ax = results_lib.new_figure((5.5, 3.6))
  width = 0.8 / len(series)
  for i, (label, prof) in enumerate(series.items()):
    ax.bar(np.arange(maxdeg) + i * width, prof[:maxdeg], width, label=label)
  ax.set(title=f"{results['task']}: degree profile (sum of f̂(S)² by |S|)", xlabel="degree", ylabel="energy")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def run_headline(cfg, methods, seeds, workdir: pathlib.Path, tasks: Sequence[str] = tuple(boolean.TASKS), log=print):
  all_tasks = headline_tasks(cfg)
  progress = results_lib.RunProgress(len(tasks) * len(methods), label="boolean")
  all_results = []
  for name in tasks:
    all_results.append(run_task(all_tasks[name], cfg, methods, seeds, pathlib.Path(workdir) / name, log=log,
                                progress=progress))
  write_headline_report(all_results, pathlib.Path(workdir))
  return all_results


def headline_table(all_results: Sequence[dict]) -> str:
  """Per task and method: unseen MSE / MDI's (mean ± std over the fitted seeds, and how many
  fitted), whether the mask reaches the paper's bar, the references; then persistence."""
  methods = [m for m in METHODS if any(r["method"] == m for res in all_results for r in res["runs"])]
  header = (["task", "n", "MDI's unseen MSE"] + [f"{m}: unseen / MDI's (fitted)" for m in methods]
            + ["mask ≤ 10% of MDI's?", "support LSQ", "count lookup"])
  rows = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    ref = res["mdi_unseen_mse_true"]
    row = [res["task"], res["n"], f"{ref:.3g}"]
    for m in methods:
      row.append(f"{_fit_cell(s[m])} ({sum(s[m]['fitted'])}/{len(s[m]['seeds'])})" if m in s else "-")
    if "mask" in s and s["mask"]["ratio_fitted"]:
      row.append("yes" if np.mean(s["mask"]["ratio_fitted"]) <= BAR else "no")
    else:
      row.append("-")
    mech = res["mechanism"]
    row += [f"{mdi_share(mech['support_lsq_unseen_mse'], ref):.3f}",
            f"{mdi_share(mech['count_lookup_unseen_mse'], ref):.3f}"]
    rows.append(row)
  header2 = ["task"] + [f"{m}: attn TV start → end" for m in methods] + ["mask: ‖B−B0‖/‖B0‖ end"]
  rows2 = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    rows2.append([res["task"]] + [f"{np.mean(s[m]['tv0']):.2f} → {np.mean(s[m]['tv_end']):.2f}" if m in s else "-"
                                  for m in methods]
                 + [results_lib.mean_std(s["mask"]["drift_end"]) if "mask" in s and s["mask"]["drift_end"] else "-"])
  return results_lib.markdown_table(header, rows) + "\n" + results_lib.markdown_table(header2, rows2)


def write_headline_report(all_results: Sequence[dict], workdir: pathlib.Path) -> None:
  if not results_lib.is_main_process():   # process 0 writes the report
    return
  (workdir / "summary.md").write_text(headline_table(all_results))
  methods = [m for m in METHODS if any(r["method"] == m for res in all_results for r in res["runs"])]
  fig, ax = results_lib.new_figure((7, 3.6))
  width = 0.8 / max(len(methods), 1)
  for i, m in enumerate(methods):
    ratios = [[mdi_share(r["unseen_mse_true"], res["mdi_unseen_mse_true"]) for r in res["runs"]
               if r["method"] == m and r["fitted"]] for res in all_results]
    ax.bar(np.arange(len(all_results)) + i * width, [np.mean(v) if v else np.nan for v in ratios], width,
           yerr=[np.std(v) if v else 0 for v in ratios], label=m, capsize=2)
  ax.axhline(1.0, ls="--", c="gray", lw=1)
  ax.axhline(0.1, ls=":", c="gray", lw=1)
  ax.set_xticks(np.arange(len(all_results)) + 0.4 - width / 2, [r["task"] for r in all_results], fontsize=8)
  ax.set(ylabel="unseen MSE / MDI's unseen MSE", title="Extrapolation error relative to the MDI (fitted runs; 1 = MDI, 0 = truth)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(workdir / "headline.png", dpi=110)
