"""The shipped platform files load, resolve their aliases and say what the docs say."""

import dataclasses

import pytest

from npuemu.isa.errors import ConfigError, NpuemuError
from npuemu.platforms import (
    COMPUTE_DTYPES,
    Platform,
    UnsupportedDtypeError,
    aliases,
    iter_leaves,
    list_platforms,
    load_platform,
    platform_from_dict,
    resolve_name,
)
from npuemu.platforms.groups import Group

SHIPPED = ["rk3562", "rk3568", "rk3576", "rk3588", "rv1106"]


def test_list_platforms_gives_the_canonical_names():
    assert list_platforms() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_file_loads_with_its_own_name(name):
    platform = load_platform(name)
    assert isinstance(platform, Platform)
    assert platform.name == name


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [("rk3566", "rk3568"), ("rv1103", "rv1106"), ("rk3588s", "rk3588"), ("RK3566", "rk3568"),
     (" Rk3588 ", "rk3588"), ("RV1106", "rv1106")],
)
def test_aliases_and_case_resolve_to_the_canonical_platform(alias, canonical):
    assert resolve_name(alias) == canonical
    assert load_platform(alias) == load_platform(canonical)


def test_alias_table_lists_only_aliases():
    assert aliases() == {"rk3566": "rk3568", "rv1103": "rv1106", "rk3588s": "rk3588"}


def test_unknown_platform_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as error:
        load_platform("rk9999")
    message = str(error.value)
    assert "unknown platform 'rk9999'" in message
    assert "rk3568 (alias rk3566)" in message and "rv1106 (alias rv1103)" in message
    assert "path to a .yaml file" in message


# Figures the compiler, emulator and timing model rely on, checked against the docs.
# (chip, key path, expected value, where the docs say so)
DOC_FIGURES = [
    ("rk3588", "cores.count", 3, "hardware.md §1"),
    ("rk3576", "cores.count", 2, "hardware.md §1"),
    ("rk3568", "cores.count", 1, "hardware.md §1"),
    ("rk3588", "clock.npu_mhz", 1000.0, "hardware.md §1"),
    ("rk3588", "register_map.family", "rk3588", "brief"),
    ("rk3576", "register_map.family", "rk3576", "rknpu-isa.md §7 item 8"),
    ("rk3568", "register_map.family", "rk356x", "rknpu-isa.md §7 item 8"),
    ("rk3588", "cbuf.banks", 12, "rknpu-isa.md §5"),
    ("rk3588", "cbuf.bank_bytes", 32768, "rknpu-isa.md §5"),
    ("rk3568", "cbuf.banks", 8, "hardware.md §1"),
    ("rk3588", "sram.size_bytes", 956 * 1024, "guide §5.7"),
    ("rk3588", "sram.granule_bytes", 4096, "guide §5.7"),
    ("rk3576", "sram.size_bytes", 1 << 20, "rknpu-isa.md §6"),
    ("rk3562", "sram.size_bytes", 256 * 1024, "rknpu-isa.md §6"),
    ("rk3568", "sram.kind", "none", "hardware.md §1"),
    ("rk3588", "vendor_estimate.ddr_bytes_per_cycle", 23.654, "vendor-corpus §4.2"),
    ("rk3562", "vendor_estimate.ddr_bytes_per_cycle", 7.465, "vendor-corpus §4.2"),
    ("rk3568", "vendor_estimate.ddr_bytes_per_cycle", 6.571, "vendor-corpus §4.2"),
    ("rk3576", "vendor_estimate.ddr_bytes_per_cycle", 7.465, "vendor-corpus §4.2"),
    ("rk3588", "cycle_model.atom_k_int8", 32, "vendor-corpus §4.1"),
    ("rk3576", "cycle_model.atom_k_int8", 32, "vendor-corpus §4.1"),
    ("rk3562", "cycle_model.atom_k_int8", 16, "vendor-corpus §4.1"),
    ("rk3568", "cycle_model.atom_k_int8", 16, "vendor-corpus §4.1"),
    ("rk3568", "cycle_model.depthwise_group", 32, "vendor-corpus §4.1"),
    ("rk3562", "cycle_model.depthwise_group", 64, "vendor-corpus §4.1"),
    ("rk3588", "cycle_model.pixel_granule", 16, "vendor-corpus §4.1"),
    ("rk3588", "cycle_model.min_taps_per_pass", 4, "vendor-corpus §4.1"),
    ("rk3588", "matmul.b_segment_k", 8192, "hardware.md §2"),
    ("rk3568", "matmul.b_segment_k", 4096, "hardware.md §2"),
    ("rv1106", "matmul.supported", False, "hardware.md §1"),
    ("rk3568", "matmul.layouts.fp16.b_k", 16, "guide table 3-5"),
    ("rk3588", "matmul.limits.int4.n_max", 8192, "guide table 3-7"),
    ("rk3562", "matmul.limits.int8.k_max", 10240, "guide table 3-7"),
    ("rk3588", "cores.parallel_batch_contexts", 3, "hardware.md §7"),
    ("rk3576", "cores.parallel_batch_contexts", 2, "hardware.md §7"),
    ("rk3576", "sparse.channel_align", 32, "hardware.md §7"),
    ("rk3588", "pc.data_amount_scale", 2, "rknpu-isa.md §2.2"),
    ("rk3576", "pc.data_amount_scale", 2, "rknpu-isa.md §2.2"),
    ("rk3562", "pc.data_amount_scale", 2, "rknpu-isa.md §2.2"),
    ("rv1106", "pc.data_amount_scale", 2, "rknpu-isa.md §2.2"),
    ("rk3568", "pc.data_amount_scale", 1, "rknpu-isa.md §2.2"),
    ("rk3588", "pc.task_number_bits", 12, "rknpu-isa.md §7 item 5"),
    ("rk3576", "pc.task_number_bits", 16, "rknpu-isa.md §7 item 5"),
    ("rk3588", "pc.max_tasks_per_submit", 4095, "rknpu-isa.md §2.3"),
    ("rk3588", "pc.dma_address_bits", 40, "rknpu-isa.md §4"),
    ("rk3568", "pc.dma_address_bits", 32, "rknpu-isa.md §4"),
    ("rk3588", "pc.register_address_bits", 32, "rknpu-isa.md §4"),
]


@pytest.mark.parametrize(("chip", "path", "expected", "doc"), DOC_FIGURES)
def test_documented_figures(chip, path, expected, doc):
    assert load_platform(chip).get(path) == expected, doc


@pytest.mark.parametrize(
    ("chip", "dtype", "macs", "c2"),
    [("rk3588", "int8", 1024, 16), ("rk3588", "fp16", 512, 8), ("rk3588", "bf16", 512, 8),
     ("rk3588", "int16", 512, 8), ("rk3588", "tf32", 256, 4), ("rk3588", "int4", 2048, 32),
     ("rk3568", "int8", 512, 8), ("rk3568", "float16", 256, 4), ("rk3562", "int8", 512, 16),
     ("rv1106", "int8", 256, 16)],
)
def test_dtype_lookups(chip, dtype, macs, c2):
    platform = load_platform(chip)
    assert platform.macs_per_cycle(dtype) == macs
    assert platform.c2(dtype) == c2
    assert platform.supports(dtype)


def test_int32_and_fp32_have_c2_but_no_mac_path():
    platform = load_platform("rk3588")
    assert platform.c2("int32") == 4 and platform.c2("float32") == 4
    assert not platform.supports("int32")


@pytest.mark.parametrize(("chip", "dtype"), [("rk3568", "int4"), ("rk3568", "tf32"), ("rv1106", "fp16"),
                                             ("rk3576", "int4"), ("rk3562", "int4")])
def test_unsupported_dtype_raises_a_compile_error_naming_chip_and_dtype(chip, dtype):
    platform = load_platform(chip)
    assert not platform.supports(dtype)
    with pytest.raises(UnsupportedDtypeError) as error:
        platform.macs_per_cycle(dtype)
    assert isinstance(error.value, NpuemuError)
    assert chip in str(error.value) and dtype in str(error.value)


def test_unknown_dtype_name_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown dtype 'int9'"):
        load_platform("rk3588").c2("int9")


def test_alignment_rows_follow_the_guide_tables():
    assert load_platform("rk3588").alignment("int8").depthwise == 64
    assert load_platform("rk3568").alignment("fp16").conv_out == 8
    assert load_platform("rv1106").alignment("int16").other == 8
    with pytest.raises(UnsupportedDtypeError):
        load_platform("rv1106").alignment("fp16")


def test_derived_figures():
    rk3588 = load_platform("rk3588")
    assert rk3588.cbuf.size_bytes == 384 * 1024
    assert rk3588.peak_tops("int8") == pytest.approx(6.144)  # the "6 TOPS" of hardware.md §1
    assert rk3588.atom_k("int8") == 32 and rk3588.atom_k("fp16") == 16  # halved for fp16 (§4.1)
    assert load_platform("rk3562").atom_k("fp16") == 8


def test_matmul_type_combinations():
    assert load_platform("rk3588").matmul.supports("int4", "int4", "int16")
    assert not load_platform("rk3576").matmul.supports("int4", "int4", "int16")  # int4: RK3588 only
    assert load_platform("rk3568").matmul.supports("float16", "float16", "float32")
    assert not load_platform("rv1106").matmul.supports("int8", "int8", "int32")


def test_split_ops_only_on_multi_core_chips():
    for name in SHIPPED:
        platform = load_platform(name)
        assert bool(platform.cores.split_ops) == (platform.cores.count > 1)
        assert "Conv" in platform.cores.split_ops or platform.cores.count == 1


@pytest.mark.parametrize("name", SHIPPED)
def test_every_figure_has_a_non_empty_source(name):
    platform = load_platform(name)
    for leaf in iter_leaves(platform):
        assert platform.source_of(leaf.path).strip(), leaf.path


@pytest.mark.parametrize("name", SHIPPED)
def test_every_group_carries_its_own_source(name):
    def groups(obj):
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if isinstance(value, Group):
                yield value
                yield from groups(value)

    assert all(group.source.strip() for group in groups(load_platform(name)))


def test_source_of_returns_the_innermost_group_source():
    platform = load_platform("rk3588")
    assert platform.source_of("matmul.layouts.int8.a_k") == platform.matmul.layouts.source
    assert platform.source_of("matmul.supported") == platform.matmul.source
    assert "calibration.md" in platform.source_of("ddr.read_bytes_per_cycle")
    assert "§4.2" in platform.source_of("vendor_estimate.ddr_bytes_per_cycle")
    assert platform.source_of("") == platform.source
    with pytest.raises(ConfigError, match="no key 'bogus'"):
        platform.source_of("ddr.bogus")


@pytest.mark.parametrize("name", SHIPPED)
def test_to_dict_round_trips(name):
    platform = load_platform(name)
    assert platform_from_dict(platform.to_dict(), "copy") == platform


def test_platform_is_frozen():
    platform = load_platform("rk3588")
    with pytest.raises(dataclasses.FrozenInstanceError):
        platform.cbuf.banks = 3  # type: ignore[misc]


def test_per_dtype_tables_cover_every_compute_dtype():
    platform = load_platform("rk3588")
    for table in (platform.macs, platform.nc1hwc2, platform.channel_alignment):
        assert all(hasattr(table, dtype) for dtype in COMPUTE_DTYPES)
