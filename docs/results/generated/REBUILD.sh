#!/usr/bin/env bash
# Rebuilds every generated results page from the committed run folders (run from the repository root).
# tests/test_docs.py checks that the committed pages equal what these commands write.
set -euo pipefail
R=experiments/results
G=docs/results/generated
maskprior report $R/boolean_headline --markdown $G/boolean_headline.md --title "Boolean headline: the tables" > /dev/null
maskprior report $R/arithmetic --markdown $G/arithmetic.md --title "Arithmetic, third round: the confirmation curve" > /dev/null
maskprior report $R/arithmetic_modadd --markdown $G/arithmetic_modadd.md --title "Arithmetic: modular addition" > /dev/null
maskprior report $R/arithmetic_init --markdown $G/arithmetic_init.md --title "Arithmetic: the qk_mask_decay=init variant" > /dev/null
maskprior report $R/arithmetic_default_cpu --markdown $G/arithmetic_default_cpu.md --title "Arithmetic: the CPU default" > /dev/null
maskprior report $R/vision $R/language --markdown $G/vision_language.md --title "Vision and language: the tables" > /dev/null
maskprior report $R/arithmetic_prev_recipe --markdown $G/arithmetic_prev_recipe.md --title "Arithmetic, second round (superseded)" > /dev/null
maskprior report $R/arithmetic_prev_default --markdown $G/arithmetic_prev_default.md --title "Arithmetic, first round (superseded)" > /dev/null
maskprior report $R/boolean_prev_default --markdown $G/boolean_prev_default.md --title "Boolean headline before the round-2 default (superseded)" > /dev/null
maskprior report $R/boolean_dropin/confirmation --markdown $G/boolean_dropin.md --title "Boolean round 4: the attention-only reader design reader_a1, confirmation" > /dev/null
# The headline charts (every seed a dot; the numbers drawn are beside each picture as .json, which
# tests/test_docs.py compares):
maskprior report $R/boolean_headline --chart $G/boolean_headline_chart.png > /dev/null
maskprior report $R/arithmetic --chart $G/arithmetic_chart.png > /dev/null
maskprior report $R/vision $R/language --chart $G/vision_language_chart.png > /dev/null
python experiments/loop_efficiency.py --markdown $R/loop_efficiency/cpu_2core_defaults_2026-12-06_stepper.jsonl --brief --chart $G/loop_efficiency_chart.png > /dev/null
