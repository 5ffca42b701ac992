"""The time-to-accuracy benchmark: its summary from made-up runs (runs need root), and its configurations."""

import math

import numpy as np
import pytest

from benchmarks.tta_report import summarise, time_to_target


def run(model, rate, config, seed, accuracies, seconds_per_eval, sent=1.0):
    timeline = [[50 * (i + 1), seconds_per_eval * (i + 1), a] for i, a in enumerate(accuracies)]
    return {"model": model, "rate": rate, "config": config, "seed": seed, "timeline": timeline,
            "final_accuracy": accuracies[-1], "dense_bytes_per_step": 100.0, "sent_bytes_per_step": sent * 100.0,
            "calibration_seconds": 0.0 if config == "dense" else 2.0}


def test_time_to_target_is_the_first_evaluation_at_or_above_it(rng):
    accuracies = sorted(rng.uniform(0.5, 0.9, 8))
    timeline = [[i, 3.0 * i, a] for i, a in enumerate(accuracies, 1)]
    target = accuracies[5]
    assert time_to_target(timeline, target) == 18.0
    assert time_to_target(timeline, accuracies[-1] + 1e-6) == math.inf


def test_summary_speedup_and_accuracy_against_dense(rng):
    dense_finals = rng.uniform(0.85, 0.9) + np.array([0.0, rng.uniform(0.0, 0.004)])  # both reach the target
    runs = [run("cnn", "1gbit", "dense", s, [0.5, 0.8, f - 0.004, f], 10.0) for s, f in enumerate(dense_finals)]
    runs += [run("cnn", "1gbit", "dragonn_0.01", s, [0.6, 0.9, 0.9, 0.9], 4.0, sent=0.02) for s in range(2)]
    runs += [run("cnn", "1gbit", "topk_0.01", 0, [0.6, 0.7, 0.7, 0.7], 4.0, sent=0.03)]
    text, rows = summarise(runs)
    by_config = {r["config"]: r for r in rows}
    target = dense_finals.mean() - 0.005
    assert by_config["dense"]["target"] == pytest.approx(target)
    # Dense reaches the target at its third evaluation when both seeds' third value clears it.
    dense_times = [30.0 if f - 0.004 >= target else 40.0 for f in dense_finals]
    assert by_config["dense"]["time"] == pytest.approx(sum(dense_times) / 2)
    assert by_config["dragonn_0.01"]["time"] == 8.0
    assert by_config["dragonn_0.01"]["speedup"] == pytest.approx(sum(dense_times) / 2 / 8.0)
    assert by_config["dragonn_0.01"]["final_vs_dense"] == pytest.approx(0.9 - dense_finals.mean())
    assert by_config["dragonn_0.01"]["sent_fraction"] == pytest.approx(0.02)
    assert by_config["topk_0.01"]["time"] == math.inf and "not reached" in text
    assert text.count("| cnn |") == 3


def test_every_configuration_makes_its_compression():
    import horovod.tensorflow.keras as hvd

    import tfcomp
    from benchmarks.tta_configs import CONFIGS, make_compression

    made = {config: make_compression(config, "sgd") for config in CONFIGS}
    assert made["dense"] == (hvd.Compression.none, False) and made["fp16"] == (hvd.Compression.fp16, False)
    assert made["intquant_8"] == (tfcomp.IntQuant(8), False)  # the optimizer keeps its momentum
    assert made["dragonn_0.001"] == (tfcomp.DRAGONN(0.001, momentum=0.9), True)
    assert made["dragonn_0.01_partitioned"] == (tfcomp.DRAGONN(0.01, momentum=0.9, strategy="partitioned"), True)
    assert make_compression("intquant_4", "adam") == (tfcomp.IntQuant(4), False)
    for bad in ("intquant_5", "dragonn", "qsgd_4", "intquant_8_partitioned"):
        with pytest.raises(ValueError, match="--config"):
            make_compression(bad, "sgd")


def test_the_sgd_rate_scales_with_the_global_batch_and_adams_does_not(rng):
    from benchmarks.tta_configs import MODEL_OPTIMIZERS, REFERENCE_BATCH, learning_rate

    workers, batch = int(rng.integers(1, 9)), int(rng.integers(1, 129))
    sgd_rate = MODEL_OPTIMIZERS["cnn"][1]
    assert learning_rate("cnn", workers) == pytest.approx(sgd_rate * workers)
    assert learning_rate("cnn", workers, batch) == pytest.approx(sgd_rate * workers * batch / REFERENCE_BATCH)
    assert learning_rate("vit", workers, batch) == MODEL_OPTIMIZERS["vit"][1]
