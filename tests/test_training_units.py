"""The training demo's pieces, one process: gradients, sharding arithmetic, optimizer, memory
accounting, data, reports and plots."""

from __future__ import annotations

import json
import os

import numpy
import pytest

from mpiring.training import CharData, Model, ModelConfig, TrainConfig, TrainingError, default_text, read_text
from mpiring.training.gpt import Block, GPTConfig
from mpiring.training.memory import MemoryTracker
from mpiring.training.model import cross_entropy_sum
from mpiring.training.optimizer import SGD
from mpiring.training.report import (
    expected_ratio,
    format_memory_table,
    format_table,
    format_time_table,
    traffic_factor,
)
from mpiring.training.sharding import Groups, Shards, make_buckets, split_bounds


def _loss_and_grads(model: Model, params: numpy.ndarray, ids, targets) -> tuple[float, numpy.ndarray]:
    h, caches = ids, []
    for i, layer in enumerate(model.layers):
        lo, hi = model.span(i)
        h, cache = layer.forward(numpy, params[lo:hi], h)
        caches.append(cache)
    loss, dh = cross_entropy_sum(numpy, h, targets)
    grads = numpy.empty_like(params)
    for i in reversed(range(len(model.layers))):
        lo, hi = model.span(i)
        dh = model.layers[i].backward(numpy, params[lo:hi], caches[i], dh, grads[lo:hi])
    return float(loss), grads


def _numeric_gradient(model, params, ids, targets, eps: float = 1e-6):
    """Central differences of the loss in every parameter (the oracle for the analytic gradient)."""
    numeric = numpy.empty_like(params)
    for k in range(model.param_count):
        bumped = params.copy()
        bumped[k] += eps
        up, _ = _loss_and_grads(model, bumped, ids, targets)
        bumped[k] -= 2 * eps
        down, _ = _loss_and_grads(model, bumped, ids, targets)
        numeric[k] = (up - down) / (2 * eps)
    return numeric


def test_backward_matches_finite_differences():
    model = Model(ModelConfig(vocab_size=7, context=3, embed=4, hidden=5, layers=2))
    params = numpy.concatenate([model.initial(i, seed=3) for i in range(len(model.layers))])
    rng = numpy.random.default_rng(0)
    ids, targets = rng.integers(0, 7, (6, 3)), rng.integers(0, 7, 6)
    _, grads = _loss_and_grads(model, params, ids, targets)
    numeric = _numeric_gradient(model, params, ids, targets)
    for k in range(model.param_count):
        assert numeric[k] == pytest.approx(grads[k], rel=1e-5, abs=1e-7), f"parameter {k}"


def test_gradient_sums_add_up_over_any_split_of_the_batch():
    model = Model(ModelConfig(vocab_size=7, context=3, embed=4, hidden=5, layers=2))
    params = numpy.concatenate([model.initial(i, seed=3) for i in range(len(model.layers))])
    rng = numpy.random.default_rng(1)
    ids, targets = rng.integers(0, 7, (5, 3)), rng.integers(0, 7, 5)
    whole_loss, whole = _loss_and_grads(model, params, ids, targets)
    parts = [_loss_and_grads(model, params, ids[a:b], targets[a:b]) for a, b in ((0, 2), (2, 2), (2, 5))]
    assert sum(p[0] for p in parts) == pytest.approx(whole_loss, rel=1e-12)
    numpy.testing.assert_allclose(sum(p[1] for p in parts), whole, rtol=1e-12, atol=1e-14)


# Two blocks of two heads, context 5: small enough to difference every parameter.
GPT_SMALL = GPTConfig(vocab_size=7, context=5, embed=8, heads=2, hidden=12, layers=2)


def _gpt_params(model: Model, seed: int) -> numpy.ndarray:
    """The initial parameters, perturbed: layer-norm gains of 1 and zero biases would hide
    mistakes in their gradients."""
    params = numpy.concatenate([model.initial(i, seed=seed) for i in range(len(model.layers))])
    return params + numpy.random.default_rng(seed).normal(0.0, 0.3, params.size)


@pytest.mark.parametrize("length", [5, 3])  # the full context, and sequences shorter than it
def test_gpt_backward_matches_finite_differences_for_every_tensor(length):
    model = Model(GPT_SMALL)
    params = _gpt_params(model, seed=4)
    rng = numpy.random.default_rng(length)
    ids, targets = rng.integers(0, 7, (3, length)), rng.integers(0, 7, 3 * length)
    _, grads = _loss_and_grads(model, params, ids, targets)
    numeric = _numeric_gradient(model, params, ids, targets)
    checked = []
    for i, layer in enumerate(model.layers):
        base = model.span(i)[0]
        for name, (lo, hi) in layer.tensors.spans.items():
            got, want = grads[base + lo : base + hi], numeric[base + lo : base + hi]
            numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{layer.name}: {name}")
            checked.append(name)
    assert {"W_query", "W_key", "W_value", "W_out", "W_fc", "W_proj", "token", "position", "W_vocab"} <= set(checked)
    assert sum(layer.size for layer in model.layers) == model.param_count


def test_gpt_attention_is_causal():
    """Changing a later character changes no earlier position's logits."""
    model = Model(GPT_SMALL)
    params = _gpt_params(model, seed=5)
    ids = numpy.random.default_rng(0).integers(0, 7, (2, 5))
    changed = ids.copy()
    changed[:, 3] = (changed[:, 3] + 1) % 7
    a, b = (model.logits(params, x).reshape(2, 5, 7) for x in (ids, changed))
    assert numpy.array_equal(a[:, :3], b[:, :3])
    assert not numpy.allclose(a[:, 3:], b[:, 3:])


def test_gpt_gradient_sums_add_up_over_any_split_of_the_batch():
    model = Model(GPT_SMALL)
    params = _gpt_params(model, seed=6)
    rng = numpy.random.default_rng(1)
    ids, targets = rng.integers(0, 7, (5, 5)), rng.integers(0, 7, (5, 5))
    whole_loss, whole = _loss_and_grads(model, params, ids, targets.reshape(-1))
    parts = [_loss_and_grads(model, params, ids[a:b], targets[a:b].reshape(-1)) for a, b in ((0, 2), (2, 2), (2, 5))]
    assert sum(p[0] for p in parts) == pytest.approx(whole_loss, rel=1e-12)
    numpy.testing.assert_allclose(sum(p[1] for p in parts), whole, rtol=1e-11, atol=1e-13)


def test_gpt_layers_are_what_the_strategies_cut():
    model = Model(GPTConfig(vocab_size=50, context=16, embed=32, heads=4, hidden=128, layers=3))
    assert [type(layer).__name__ for layer in model.layers] == ["Embedding", "Block", "Block", "Block", "Head"]
    block = model.layers[1]
    assert isinstance(block, Block) and block.size == 4 * (32 * 32 + 32) + 4 * 32 + 2 * 32 * 128 + 128 + 32
    assert model.param_count == 50 * 32 + 16 * 32 + 3 * block.size + 2 * 32 + 32 * 50


def test_gpt_data_predicts_every_position():
    data = CharData("hello world, hello mpiring! " * 20, context=4)
    inputs, targets = data.batch(3, 8, 1, rank=0, size=1, every_position=True)
    assert inputs.shape == (8, 4) and targets.shape == (32,)
    assert numpy.array_equal(targets.reshape(8, 4)[:, :-1], inputs[:, 1:])
    start = data.global_batch(3, 8, seed=1)[0]
    assert targets[3] == data.tokens[start + 4]


def test_the_learning_rate_schedule():
    gpt = TrainConfig(model="gpt", warmup=10, decay_steps=110)
    assert [gpt.schedule(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert gpt.schedule(60) == pytest.approx(0.55)
    assert gpt.schedule(110) == pytest.approx(0.1) and gpt.schedule(500) == pytest.approx(0.1)
    mlp = TrainConfig(model="mlp")
    assert mlp.steps == 200 and {mlp.schedule(s) for s in (0, 100, 1000)} == {1.0}
    assert TrainConfig().steps == 400 and TrainConfig().examples == 128
    assert TrainConfig(embed=30).model_config(10).heads == 3  # --embed alone: the most heads that fit
    with pytest.raises(TrainingError, match="multiple of the 5 heads"):
        TrainConfig(model="gpt", heads=5).check()
    with pytest.raises(TrainingError, match="gpt model only"):
        TrainConfig(model="mlp", heads=2).check()


def test_step_directories_list_those_without_a_manifest(tmp_path):
    from mpiring.training import checkpoint

    assert checkpoint.step_directories(str(tmp_path / "missing")) == []
    (tmp_path / "step-00000010").mkdir()
    (tmp_path / "step-00000010" / "manifest.json").write_text("{}")
    for name in ("step-00000020", "step-00000005", ".tmp-step-00000030", ".old-step-00000010", "step-x"):
        (tmp_path / name).mkdir()
    for k in range(3):
        (tmp_path / "step-00000020" / f"shard-{k:05d}.npy").write_bytes(b"")
        (tmp_path / "step-00000020" / f"shard-{k:05d}.npy.json").write_bytes(b"")
    found = checkpoint.step_directories(str(tmp_path))
    assert [(entry.step, entry.complete) for entry in found] == [(20, False), (10, True), (5, False)]
    assert checkpoint.complete(str(tmp_path)) == [str(tmp_path / "step-00000010")]
    assert checkpoint.unfinished(str(tmp_path)) == [".tmp-step-00000030"]
    assert checkpoint.missing_manifest(found[0].path) == (
        "no manifest.json (incomplete or damaged; it holds shard-00000.npy, shard-00000.npy.json, "
        "shard-00001.npy, shard-00001.npy.json and 2 more files)")
    assert checkpoint.missing_manifest(found[2].path) == "no manifest.json (incomplete or damaged; it is empty)"
    (tmp_path / "step-00000040").write_text("not a directory")
    assert checkpoint.missing_manifest(str(tmp_path / "step-00000040")).startswith(
        "no manifest.json (incomplete or damaged; it cannot be listed: ")


def test_fresh_needs_resume():
    with pytest.raises(TrainingError, match="fresh applies with resume only"):
        TrainConfig(checkpoint_dir="ckpt", fresh=True).check()
    TrainConfig(checkpoint_dir="ckpt", resume=True, fresh=True).check()


@pytest.mark.parametrize("total", [0, 1, 7, 10, 64])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8])
def test_split_bounds_cut_like_array_split(total, parts):
    bounds = split_bounds(total, parts)
    sizes = [len(chunk) for chunk in numpy.array_split(numpy.arange(total), parts)]
    assert numpy.diff(bounds).tolist() == sizes


def test_buckets_cover_every_layer_once_in_backward_order():
    assert make_buckets([10, 20, 30, 40], cap_bytes=50) == [(3, 3), (1, 2), (0, 0)]
    assert make_buckets([10, 20, 30, 40], cap_bytes=0) == [(3, 3), (2, 2), (1, 1), (0, 0)]
    assert make_buckets([10, 20, 30, 40], cap_bytes=10**6) == [(0, 3)]
    groups = Groups.build([0, 10, 30, 60, 100], make_buckets([10, 20, 30, 40], 50))
    assert groups.ranges == ((60, 100), (10, 60), (0, 10))
    assert [groups.completed_by(i) for i in range(4)] == [2, 1, None, 0]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_shards_partition_every_group(size):
    ranges = [(60, 100), (10, 60), (0, 10), (100, 103)]
    owned = numpy.zeros(103, dtype=int)
    for rank in range(size):
        shards = Shards.of(ranges, rank, size)
        assert shards.length == sum(hi - lo for lo, hi in shards.pieces)
        for (lo, hi), (a, b) in zip(shards.pieces, shards.local, strict=True):
            owned[lo:hi] += 1
            assert b - a == hi - lo
    assert (owned == 1).all()


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_update_is_the_same_on_pieces_as_on_the_whole(momentum):
    rng = numpy.random.default_rng(2)
    opt = SGD(lr=0.1, momentum=momentum)
    param, grad, velocity = rng.normal(size=(3, 11))
    whole = [param.copy(), grad.copy(), [velocity.copy()]]
    opt.update(numpy, whole[0], whole[1], whole[2], 7)
    pieces = [param.copy(), grad.copy(), velocity.copy()]
    for a, b in ((0, 4), (4, 4), (4, 11)):
        opt.update(numpy, pieces[0][a:b], pieces[1][a:b], [pieces[2][a:b]], 7)
    assert numpy.array_equal(pieces[0], whole[0])
    assert opt.slots == (1 if momentum else 0)


def test_memory_tracker_sees_buffers_die():
    memory = MemoryTracker()
    kept = memory.persistent("params", numpy, 100, numpy.float32)
    buffer = memory.transient(numpy, 50, numpy.float64)
    view = buffer[10:20]
    del buffer
    assert memory.live["transient"] == 400  # the view keeps the whole buffer alive
    del view
    assert memory.live["transient"] == 0
    assert memory.snapshot() == {"params": 400, "grads": 0, "optimizer": 0, "model_state": 400,
                                 "peak": 800, "peak_transient": 400}
    assert kept.nbytes == 400


def test_data_batches_depend_on_seed_and_step_only():
    data = CharData("hello world, hello mpiring! " * 20, context=4)
    assert data.vocab == "".join(sorted(set(data.vocab)))
    a = data.global_batch(3, 8, seed=1)
    assert numpy.array_equal(a, CharData("hello world, hello mpiring! " * 20, 4).global_batch(3, 8, seed=1))
    assert not numpy.array_equal(a, data.global_batch(4, 8, seed=1))
    inputs, targets = data.batch(3, 8, 1, rank=0, size=1)
    assert data.decode(inputs[0].tolist()) + data.decode([int(targets[0])]) == \
        data.decode(data.tokens[a[0] : a[0] + 5].tolist())
    with pytest.raises(TrainingError, match="larger than"):
        data.check_batch_size(10**6)
    with pytest.raises(TrainingError, match="too short"):
        CharData("abc", context=4)


def test_default_text_ships_with_python():
    assert len(default_text()) > 100_000


def test_unreadable_data_files_say_why(tmp_path):
    with pytest.raises(TrainingError, match="does not exist"):
        read_text(str(tmp_path / "missing.txt"))
    with pytest.raises(TrainingError, match="is a directory"):
        read_text(str(tmp_path))
    odd = tmp_path / "latin1.txt"
    odd.write_bytes(b"caf\xe9 au lait")
    assert read_text(str(odd)) == "caf\ufffd au lait"


def test_expected_ratios_are_the_zero_papers_for_fp32_momentum():
    for n in (1, 2, 4, 8):
        assert expected_ratio("zero1", n, 1) == pytest.approx((8 + 4 / n) / 12)
        assert expected_ratio("zero2", n, 1) == pytest.approx((4 + 8 / n) / 12)
        assert expected_ratio("zero3", n, 1) == pytest.approx((12 / n) / 12)
    assert traffic_factor("zero3", 4)[0] == pytest.approx(3 * 3 / 4)
    assert traffic_factor("zero2", 4)[0] == pytest.approx(2 * 3 / 4)


def _fake_report(strategy: str, ratio: float) -> dict:
    state = int(1_000_000 * ratio)
    return {"strategy": strategy, "world_size": 4, "final_loss": 2.5, "tokens_per_s": 1000.0,
            "losses": [4.0, 3.0, 2.5], "param_count": 1000, "model_state_bytes_per_rank": state,
            "model_state_ratio_to_ddp": ratio, "expected_ratio_to_ddp": ratio, "peak_bytes_per_rank": state + 10,
            "memory_bytes_per_rank": {"params": state // 3, "grads": state // 3, "optimizer": state // 3},
            "bytes_sent_per_rank": 1500.0, "bytes_sent_per_rank_theory": 1500.0,
            "traffic_formula": "2(N-1)/N x model bytes", "transient_peak_bytes_per_rank": 10, "steps_run": 3,
            "step_seconds": 0.3, "compute_seconds": 0.2, "comm_seconds": 0.1, "hidden_seconds": 0.1,
            "hidden_share": 0.5, "overlap": strategy == "zero3"}


def test_summary_table_and_strategy_plot(tmp_path):
    reports = [_fake_report("ddp", 1.0), _fake_report("zero3", 0.25)]
    table = format_table(reports)
    assert "zero3 +overlap" in table and "0.250" in table
    times = format_time_table(reports).splitlines()
    assert times[2].split()[3:] == ["100.0", "66.7", "33.3", "33.3", "50%"]  # ms per step, share hidden
    memory = format_memory_table(reports).splitlines()
    assert "gathered peak" in memory[0] and "0.2500" in memory[3]
    pytest.importorskip("matplotlib")
    from mpiring.training.plotting import plot_run, plot_strategies

    plot_strategies(reports, str(tmp_path / "s.png"))
    plot_run(reports[0], str(tmp_path / "r.png"))
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert (tmp_path / "r.png").stat().st_size > 1000
    json.dumps(reports)  # reports are plain JSON
    assert os.path.exists(tmp_path / "r.png")
