"""Low-data arithmetic benchmark, small CPU default.

  maskprior arithmetic --workdir runs/arithmetic       # 3-digit addition, 500 examples, 6 methods x seeds 0-4
  maskprior arithmetic --train-sizes 250,500,1000,2000 --workdir runs/curve   # a longer learning curve
  maskprior arithmetic --task modadd --train-sizes 1000,2000,4000 --workdir runs/modadd
  maskprior arithmetic --task add --digits 5 --config.train.steps=12000 --workdir runs/add5

The recipe is the one the protocol's rule selected on the exploration seeds
(bench/arithmetic/protocol.py, experiments/results/arithmetic_recipe/recipe.md): AdamW at lr 2e-3
(b2 0.98) with linear warmup over 300 steps and cosine decay to 0 at 6,000 steps, gradient clipping
at global norm 1, weight decay 1.0 on weight matrices only (the query/key kernels and the mask prior
not decayed, in every method), a validation split of 500 pairs for checkpoint selection, and
position coupling as published (Cho et al.). The size, 500, is where the methods separate in the
committed curve (experiments/results/arithmetic, sizes 250..2000, made by
experiments/arithmetic_curve.py: the largest size where vanilla stays below 90%); one size keeps
six methods x five seeds near half an hour on 2 CPU cores. Every run of the curve fits its
training set. Before (the committed second
round, experiments/results/arithmetic_prev_recipe): constant lr 1e-3, b2 0.999, weight decay 1.0 on
every parameter, no warmup, clipping or validation, coupling "rows".
"""
import ml_collections

from maskprior_jax.bench.config import base_config


def get_config() -> ml_collections.ConfigDict:
  c = base_config()   # the loop's keys (train, eval, checkpoint, prior.mode, qk, mimetic): see there
  # add: D-digit operands, answer least significant digit first (reverse=True) or not.
  # modadd: (a + b) mod modulus. Test pairs never appear in a training set; each seed's
  # training sets are nested (the first N of its pairs).
  # val_size: validation pairs drawn like the training pairs (disjoint from test and training sets);
  # when > 0 every run is also scored at its best validation step (`run.select_on_validation`).
  # coupling: "published" (Cho et al.'s ids, a random starting id per training example, drawn from
  # 1..coupling_max_position - digits - 1; start 1 at evaluation) or "rows" (the first version's).
  c.task = dict(name="add", digits=3, modulus=97, reverse=True, train_sizes=(500,),
                test_size=2000, data_seed=0, val_size=500, coupling="published", coupling_max_position=20)
  # A causal decoder (next-token prediction, loss on the answer tokens only).
  c.model.update(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=256, pos_embedding="learned")
  # The prior: the rows that predict answer digits attend to their operand columns (logit
  # `inside`) and get `outside` elsewhere; one pattern for every head and layer. Methods
  # "coupling" and "mask_coupling" add position coupling (addition only).
  # kind "window": places i and i-1 only; "carry": every lower place too, at inside - carry_decay
  # per place below i-1 (see ArithmeticTask.prior_pattern).
  c.prior.update(inside=0.0, outside=-4.0, mode="learned", mask_lr_multiplier=1.0, kind="window",
                 carry_decay=1.0)
  # The recipe (train.LoopSettings); a run shorter than 300 steps needs a shorter warmup too.
  c.train.update(steps=6000, batch_size=64, learning_rate=2e-3, optimizer="adamw", weight_decay=1.0,
                 steps_per_call=50, warmup_steps=300, schedule="cosine", grad_clip_norm=1.0, b2=0.98,
                 decay_on="matrices", qk_mask_decay="none")
  c.eval.update(every_steps=250, train_eval_size=250, probe_size=128)
  c.checkpoint.update(every_steps=1000, max_to_keep=2)
  return c
