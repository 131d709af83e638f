"""Overrides: 'key.path=value' strings or a mapping, parsed with the field's type, same checks."""

import dataclasses
import math
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.errors import ConfigError
from npuemu.platforms import apply_overrides, iter_leaves, list_platforms, load_platform
from npuemu.platforms.schema import unwrap_optional


def test_override_round_trip():
    platform = load_platform("rk3588", ["ddr.read_bytes_per_cycle=8", "cores.count=2",
                                        "cores.parallel_batch_contexts=2", "clock.npu_mhz=800"])
    assert platform.ddr.read_bytes_per_cycle == 8.0
    assert isinstance(platform.ddr.read_bytes_per_cycle, float)
    assert platform.cores.count == 2 and platform.cores.parallel_batch_contexts == 2
    assert platform.clock.npu_mhz == 800.0
    untouched = load_platform("rk3588")
    assert platform.ddr.write_bytes_per_cycle == untouched.ddr.write_bytes_per_cycle
    assert untouched.ddr.read_bytes_per_cycle == 5.887  # the shipped data is not mutated


def test_mapping_overrides_accept_text_and_values():
    by_text = load_platform("rk3576", {"cbuf.banks": "8", "sram.size_bytes": "524288"})
    by_value = load_platform("rk3576", {"cbuf.banks": 8, "sram.size_bytes": 524288})
    assert by_text == by_value
    assert by_text.cbuf.size_bytes == 8 * 32768


def test_override_kinds():
    platform = load_platform("rk3568", [
        "macs.int4=null",                      # optional -> null
        "pc.max_tasks_per_submit=0xfff",       # integers accept 0x.. and _
        "launch.task_overhead_cycles=1_000",
        "matmul.supported=true",
        "cores.split_ops=Conv, Add",           # lists: comma-separated ...
        "fusion.subgraphs=[GLU]",              # ... or YAML flow
        "description=  my board  ",            # text is stripped (shell quoting leftovers)
        "channel_alignment.tf32={conv_in: 16, conv_out: 8, depthwise: 8, other: 4}",  # a whole row
    ])
    assert platform.macs.int4 is None
    assert platform.pc.max_tasks_per_submit == 4095
    assert platform.launch.task_overhead_cycles == 1000
    assert platform.cores.split_ops == ("Conv", "Add")
    assert platform.fusion.subgraphs == ("GLU",)
    assert platform.description == "my board"
    assert platform.alignment("tf32").conv_in == 16


def test_apply_overrides_to_a_loaded_platform():
    base = load_platform("rk3562")
    changed = apply_overrides(base, ["cycle_model.min_taps_per_pass=2"])
    assert changed.cycle_model.min_taps_per_pass == 2
    assert base.cycle_model.min_taps_per_pass == 4


def test_user_file_with_overrides(write_yaml, raw_platform):
    path = write_yaml(raw_platform("rk3588"), "mychip.yaml")
    assert load_platform(str(path), ["name=mychip"]).name == "mychip"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("ddr.bandwidth=8", "rk3588.yaml: override 'ddr.bandwidth=8': ddr.bandwidth: unknown key path: "
                            "no key 'bandwidth' in ddr; expected one of: source, note, read_bytes_per_cycle"),
        ("gpu.cores=2", "gpu.cores: unknown key path: no key 'gpu' in a platform"),
        ("cbuf.banks.low=1", "cbuf.banks.low: unknown key path: 'cbuf.banks' is a single figure, not a group"),
        ("cbuf.banks=abc",
         "rk3588.yaml: override 'cbuf.banks=abc': cbuf.banks: expected an integer in [1, 15], got 'abc'"),
        ("cbuf.banks=1.5", "cbuf.banks: expected an integer in [1, 15], got '1.5'"),
        ("cbuf.banks=16", "cbuf.banks: expected an integer in [1, 15], got '16'"),
        ("cbuf.banks=null", "cbuf.banks: expected an integer in [1, 15], got 'null'"),
        ("ddr.read_bytes_per_cycle=-1", "ddr.read_bytes_per_cycle: expected a number > 0 and <= 1024, got '-1'"),
        ("ddr.read_bytes_per_cycle=inf", "ddr.read_bytes_per_cycle: expected a number > 0 and <= 1024, got 'inf'"),
        ("matmul.supported=maybe", "matmul.supported: expected a boolean, got 'maybe'"),
        ("register_map.family=rk9", "register_map.family: expected one of 'rk3588', 'rk3576', 'rk356x', got 'rk9'"),
        ("cbuf=3", "cbuf: expected a mapping, got 3"),
        ("cores.count=", "cores.count: expected an integer in [1, 16], got ''"),
        ("cbuf.banks", "override 'cbuf.banks': expected KEY=VALUE"),
        ("=3", "override '=3': expected KEY=VALUE"),
        ("cores.parallel_batch_contexts=4",
         "rk3588.yaml (with overrides): cores.parallel_batch_contexts: expected at most cores.count (3), got 4"),
    ],
)
def test_bad_override_names_the_override_path_and_expectation(override, expected):
    with pytest.raises(ConfigError) as error:
        load_platform("rk3588", [override])
    assert expected in str(error.value)


def test_override_inside_a_null_row_asks_for_the_whole_row():
    with pytest.raises(ConfigError, match=r"cannot set a figure inside 'channel_alignment.tf32': it is null"):
        load_platform("rk3568", ["channel_alignment.tf32.conv_in=16"])


# ---- property: any numeric figure, valid value round-trips, invalid one raises ----------------

def _numeric_leaves(platform):
    for leaf in iter_leaves(platform):
        kind, _ = unwrap_optional(leaf.hint)
        if kind in (int, float):
            yield leaf, kind


PLATFORMS = {name: load_platform(name) for name in list_platforms()}
LEAVES = {(name, leaf.path): (leaf, kind) for name, p in PLATFORMS.items() for leaf, kind in _numeric_leaves(p)}
CASES = sorted(LEAVES)  # (platform, key path): short reprs in hypothesis reports


def test_the_property_below_covers_many_figures():
    assert len({path for _, path in CASES}) > 60


def _divisors(number, limit):
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return sorted(d for d in set(small + [number // d for d in small]) if d <= limit)


def _bounds(platform, leaf):
    """(low, high) of valid values, narrowed by the rules that tie figures together."""
    spec = leaf.spec
    low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
    high = spec.maximum
    if leaf.path == "cores.count":
        low = max(low, platform.cores.parallel_batch_contexts)
    elif leaf.path == "cores.parallel_batch_contexts":
        high = platform.cores.count
    elif leaf.path == "pc.task_number_bits":
        low = max(low, platform.pc.max_tasks_per_submit.bit_length())
    elif leaf.path == "pc.max_tasks_per_submit":
        high = (1 << platform.pc.task_number_bits) - 1
    return low, high


def _valid_values(name, path):
    """(override text, expected value) pairs that keep the platform valid."""
    platform, (leaf, kind) = PLATFORMS[name], LEAVES[name, path]
    spec = leaf.spec
    if leaf.value is None:  # a null figure: only null keeps the other figures consistent in general
        return st.just(("null", None))
    if spec.choices:
        return st.sampled_from(spec.choices).map(lambda v: (str(v), v))
    if path.startswith("sram.") and platform.sram.kind == "none":
        return st.just(("0", 0))
    if path == "sram.size_bytes":
        granule = platform.sram.granule_bytes
        return st.integers(1, spec.maximum // granule).map(lambda n: (str(n * granule), n * granule))
    if path == "sram.granule_bytes":
        return st.sampled_from(_divisors(platform.sram.size_bytes, spec.maximum)).map(lambda v: (str(v), v))
    low, high = _bounds(platform, leaf)
    if kind is int:
        return st.integers(int(low), int(high)).map(lambda v: (str(v), v))
    exclusive = spec.exclusive_minimum is not None
    floats = st.floats(low, high, exclude_min=exclusive, allow_nan=False, allow_infinity=False)
    return floats.map(lambda v: (repr(v), v))


def _invalid_texts(name, path):
    leaf, kind = LEAVES[name, path]
    spec = leaf.spec
    bad = [st.sampled_from(["abc", "", "1e", "[1]", "true"])]
    if not unwrap_optional(leaf.hint)[1]:
        bad.append(st.just("null"))
    if spec.choices:
        bad.append(st.integers(-1000, 1000).filter(lambda v: v not in spec.choices).map(str))
        return st.one_of(bad)
    high = spec.maximum
    low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
    if kind is int:
        bad += [st.integers(int(high) + 1, int(high) + 10**6).map(str),
                st.integers(int(low) - 10**6, int(low) - 1).map(str),
                st.sampled_from(["1.5", "2.0"])]
    else:
        below = (st.floats(max_value=low, allow_nan=False, allow_infinity=False) if spec.exclusive_minimum is not None
                 else st.floats(max_value=low, exclude_max=True, allow_nan=False, allow_infinity=False))
        bad += [below.map(repr), st.floats(min_value=high, exclude_min=True, allow_infinity=False).map(repr),
                st.sampled_from(["nan", "inf", "-inf"])]
    return st.one_of(bad)


@given(st.sampled_from(CASES).flatmap(lambda case: st.tuples(st.just(case), _valid_values(*case))))
def test_a_valid_value_for_any_numeric_figure_round_trips(drawn):
    (name, path), (text, value) = drawn
    leaf, kind = LEAVES[name, path]
    platform = load_platform(name, [f"{leaf.path}={text}"])
    result = platform.get(leaf.path)
    assert result == value
    if value is not None:
        assert type(result) is kind
    if kind is float and value is not None:
        assert math.isfinite(result)


@given(st.sampled_from(CASES).flatmap(lambda case: st.tuples(st.just(case), _invalid_texts(*case))))
def test_an_invalid_value_for_any_numeric_figure_raises_config_error(drawn):
    (name, path), text = drawn
    with pytest.raises(ConfigError) as error:
        load_platform(name, [f"{path}={text}"])
    assert path in str(error.value)
    assert f"{name}.yaml" in str(error.value)


def test_hints_are_all_understood():
    # Every leaf type is one the validator and the override parser handle.
    for leaf in iter_leaves(PLATFORMS["rk3588"]):
        kind, _ = unwrap_optional(leaf.hint)
        understood = kind in (int, float, str, bool) or typing.get_origin(kind) is tuple
        assert understood or (dataclasses.is_dataclass(kind) and leaf.value is None), leaf.path
