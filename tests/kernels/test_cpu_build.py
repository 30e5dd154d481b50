"""Building the C++ CPU kernels (cpu_build.py), and the backend choice that follows from it."""

import pytest

from nanoserve.kernels import cpu_attention, cpu_build, cpu_layer_ops, get_ops, kernel_backend, reference

needs_ops = pytest.mark.skipif(not cpu_build.available(),
                               reason=f"C++ ops not built: {cpu_build.unavailable_reason()}")

@needs_ops
def test_the_cpu_backend_is_the_default_on_cpu_and_reference_can_be_chosen(monkeypatch):
    monkeypatch.delenv("NANOSERVE_KERNELS", raising=False)
    assert kernel_backend("cpu") == "cpu"
    assert get_ops("cpu").paged_attention is cpu_attention.paged_attention
    for name in ("rms_norm", "rotary_embedding", "reshape_and_cache"):
        assert getattr(get_ops("cpu"), name) is getattr(cpu_layer_ops, name)
    monkeypatch.setenv("NANOSERVE_KERNELS", "reference")
    assert get_ops("cpu") is reference


def test_without_the_op_the_backend_is_the_reference(monkeypatch):
    monkeypatch.delenv("NANOSERVE_KERNELS", raising=False)
    monkeypatch.setattr(cpu_build, "available", lambda: False)
    assert kernel_backend("cpu") == "reference" and get_ops("cpu") is reference


def test_other_systems_are_told_why_not(monkeypatch):
    monkeypatch.setattr("sys.platform", "darwin")
    assert cpu_build.available.__wrapped__() is False
    assert "darwin" in cpu_build._why_not[-1]


def test_a_failed_build_falls_back_naming_the_compiler_error(monkeypatch, tmp_path):
    good, bad = tmp_path / "good.cpp", tmp_path / "bad.cpp"
    good.write_text("int answer() { return 42; }\n")
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_build, "SOURCES", [str(good), str(bad)])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="fall back to the torch reference"):
        assert cpu_build.available.__wrapped__() is False
    assert "bad.cpp" in cpu_build._why_not[-1] and "good.cpp" not in cpu_build._why_not[-1]
    built = tmp_path / "cache" / "nanoserve" / "kernels"
    assert [p.name for p in built.iterdir() if not p.name.endswith(".lock")] == []  # nothing half-built


@pytest.mark.parametrize("vendor, family, splits", [("AuthenticAMD", 25, True), ("AuthenticAMD", 26, False),
                                                    ("GenuineIntel", 6, False), ("AuthenticAMD", 23, False)])
def test_which_cpus_split_512_bit_ops(vendor, family, splits):
    core = f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 2\n"
    assert cpu_build.splits_512_bit_ops(core.format(0) + "\n" + core.format(1)) is splits
