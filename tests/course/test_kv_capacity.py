"""course.experiments.capacity (lesson 03's KV-capacity widget) and the batch x context grid's
cells, checked by hand."""

import pytest

from nanoserve.course import experiments as ex
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.sim.devices import DEVICES, model_shape


def test_llama_3_8b_on_an_h100_by_hand():
    c = ex.datasheet_capacity("llama-3-8b", 4096, "H100-SXM")
    cfg = model_shape("llama-3-8b")
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert c.kv_bytes_per_token == per_token == 128 * 1024
    memory = 80e9 * 0.92
    assert c.max_batch == int((memory - cfg.num_params() * 2) // (per_token * 4096)) == 107
    kv = c.max_batch * 4096 * per_token / DEVICES["H100-SXM"].bandwidth
    assert c.kv_read_s == pytest.approx(kv, rel=0.01)  # + this step's K, V, Q, output: tiny
    assert c.kv_read_s > 3 * c.weight_read_s  # at full memory the KV read dominates
    assert c.floor_s == pytest.approx(c.weight_read_s + c.kv_read_s)  # memory-bound
    assert c.compute_s < c.floor_s / 5
    assert c.tokens_per_s == pytest.approx(c.max_batch / c.floor_s)


def test_dtypes_move_the_batch_as_their_bytes_say():
    base = ex.datasheet_capacity()
    fp8_kv = ex.datasheet_capacity(kv_dtype="fp8")
    assert fp8_kv.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    assert fp8_kv.max_batch in (2 * base.max_batch, 2 * base.max_batch + 1)
    int4 = ex.datasheet_capacity(weight_dtype="int4")
    assert int4.weight_bytes == pytest.approx(base.weight_bytes / 4)
    assert int4.max_batch > base.max_batch and int4.weight_read_s < base.weight_read_s / 3


def test_too_little_memory_and_bad_names():
    assert ex.datasheet_capacity("llama-3-70b", 4096, "H100-SXM").max_batch == 0  # 141 GB of weights
    with pytest.raises(ValueError, match="weight_dtype='int3'"):
        ex.datasheet_capacity(weight_dtype="int3")
    with pytest.raises(ValueError, match="kv_dtype='int4'"):
        ex.datasheet_capacity(kv_dtype="int4")
    with pytest.raises(ValueError, match="device='B300'"):
        ex.datasheet_capacity(device="B300")


def test_grid_cells_leave_out_what_does_not_fit():
    assert ex.grid_cells((16, 1, 4), (1536, 256), 24576) == {256: [1, 4, 16], 1536: [1, 4, 16]}
    assert ex.grid_cells((1, 4, 16), (256, 2048), 8192) == {256: [1, 4, 16], 2048: [1, 4]}


def test_the_grid_measures_every_cell_and_counts_its_bytes():
    from nanoserve.course import setup
    llm = setup.load_llm("preset:tiny", num_kv_blocks=256, max_num_seqs=4)
    points = ex.decode_grid(llm, (1, 4), (16, 64), 4 * 64, steps=2, reps=1, progress=False)
    assert [(p.batch, p.context_len - 2) for p in points] == [(1, 16), (4, 16), (1, 64), (4, 64)]
    assert all(p.step_seconds > 0 for p in points)
    by = {(p.batch, p.context_len): p for p in points}
    # the weights are read once whatever the batch (activations and logits grow a little)
    assert by[(4, 66)].weight_bytes == pytest.approx(by[(1, 66)].weight_bytes, rel=0.05)
    assert by[(4, 66)].kv_bytes == pytest.approx(4 * by[(1, 66)].kv_bytes, rel=0.01)
    crossover = ex.kv_crossover_tokens(llm)
    per_token = kv_bytes_per_token(llm.engine.model_config, "float32")
    for p in points:  # the whole KV of every sequence, plus this step's K, V, Q and output
        assert p.kv_tokens * per_token < p.kv_bytes < 1.2 * p.kv_tokens * per_token
    weights = by[(1, 18)].weight_bytes
    assert crossover * per_token == pytest.approx(weights, rel=0.02)


def test_two_replicas_at_b_against_one_at_2b(monkeypatch):
    from types import SimpleNamespace

    from nanoserve.course.experiments import replicas

    runs = [(4, 0.003), (8, 0.005)]  # (batch, median TPOT): `batch` requests done in one second
    monkeypatch.setattr(replicas, "goodput_points", lambda points, slo: [
        SimpleNamespace(batch=b, throughput=float(b), goodput=float(b) if t <= slo else 0.0,
                        median_tpot=t) for b, t in runs])
    table = ex.replica_table([], 4, {"strict": 0.004, "loose": 0.006}, 3.6)
    rows = table.rows
    strict, loose = rows[:3], rows[3:]
    # each SLO by its name, its limit once in the title: a slide's column stays one line wide
    assert [r["SLO"] for r in rows] == ["strict"] * 3 + ["loose"] * 3
    assert "strict TPOT <= 4.00 ms, loose TPOT <= 6.00 ms" in table.title
    assert [r["goodput requests/s"] for r in strict] == [4, 0, 8]
    assert strict[1]["$ per 1M good requests"] == "no goodput"
    # $3.60 an hour is $0.001 a second: 1e6 requests at 4/s cost $250; two devices at 8/s the same
    assert strict[0]["$ per 1M good requests"] == pytest.approx(250) == strict[2]["$ per 1M good requests"]
    assert loose[1]["$ per 1M good requests"] == pytest.approx(125)  # 2B on one device: half


def test_a_given_memory_replaces_the_devices_and_the_widget_gets_a_slider():
    full = ex.datasheet_capacity("llama-3-8b", 4096, "H100-SXM")
    small = ex.datasheet_capacity("llama-3-8b", 4096, "H100-SXM", memory=24e9)
    per_request = small.kv_bytes_per_request
    assert small.max_batch == int((24e9 - small.weight_bytes) // per_request) < full.max_batch
    fp8 = ex.datasheet_capacity("llama-3-8b", 4096, "H100-SXM", kv_dtype="fp8", memory=24e9)
    assert fp8.max_batch in (2 * small.max_batch, 2 * small.max_batch + 1)
    from nanoserve.course.widgets import kv_capacity_explorer
    box = kv_capacity_explorer(memory_gb=24)
    sliders = [w for row in box.children for w in getattr(row, "children", [row])
               if getattr(w, "description", "") == "memory GB"]
    assert len(sliders) == 1 and sliders[0].value == 24
    assert "memory GB" not in repr(kv_capacity_explorer())
