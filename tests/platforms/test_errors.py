"""Each class of bad platform YAML raises ConfigError naming the file, key path and expectation."""

import time

import pytest

from npuemu.isa.errors import ConfigError
from npuemu.platforms import MAX_YAML_BYTES, load_platform


def error_of(path) -> str:
    with pytest.raises(ConfigError) as error:
        load_platform(path)
    return str(error.value)


def test_unknown_key_names_file_path_and_the_known_keys(raw_platform, write_yaml):
    data = raw_platform("rk3588")
    data["ddr"]["bandwidth"] = 8
    path = write_yaml(data, "rk3588.yaml")
    message = error_of(path)
    assert message.startswith(f"{path}: ddr.bandwidth: unknown key; expected one of:")
    assert "read_bytes_per_cycle" in message


def test_unknown_top_level_key(raw_platform, write_yaml):
    data = raw_platform("rk3588")
    data["gpu"] = {}
    assert f"{write_yaml(data)}: gpu: unknown key" in error_of(write_yaml(data))


def test_missing_key_names_path_and_expected_type(raw_platform, write_yaml):
    data = raw_platform("rk3588")
    del data["ddr"]["read_bytes_per_cycle"]
    path = write_yaml(data, "rk3588.yaml")
    assert error_of(path) == (f"{path}: ddr.read_bytes_per_cycle: missing key; "
                              "expected a number > 0 and <= 1024")


def test_missing_group(raw_platform, write_yaml):
    data = raw_platform("rk3568")
    del data["cbuf"]
    assert "cbuf: missing key; expected a mapping" in error_of(write_yaml(data))


def test_missing_dtype_row_must_be_explicit_null(raw_platform, write_yaml):
    data = raw_platform("rk3568")
    del data["macs"]["int4"]
    assert "macs.int4: missing key; expected an integer in [1, 65536] or null" in error_of(write_yaml(data))


@pytest.mark.parametrize(
    ("group", "key", "value", "expected"),
    [
        ("cores", "count", "three", "cores.count: expected an integer in [1, 16], got 'three'"),
        ("cores", "count", 2.5, "cores.count: expected an integer in [1, 16], got 2.5"),
        ("cores", "count", True, "cores.count: expected an integer in [1, 16], got True"),
        ("ddr", "read_bytes_per_cycle", "fast", "ddr.read_bytes_per_cycle: expected a number > 0"),
        ("cbuf", "banks", None, "cbuf.banks: expected an integer in [1, 15], got null"),
        ("matmul", "supported", "yes please", "matmul.supported: expected a boolean, got 'yes please'"),
        ("cores", "split_ops", "Conv", "cores.split_ops: expected a list, each item a string"),
        ("cores", "split_ops", ["Conv", 3],
         "cores.split_ops[1]: expected a string (an operator name such as 'Conv'), got 3"),
        ("cbuf", "bank_bytes", [1, 2],
         "cbuf.bank_bytes: expected an integer in [1024, 1048576], got a list of 2 items"),
        ("register_map", "family", 3588, "register_map.family: expected one of 'rk3588', 'rk3576', 'rk356x', got 3588"),
        ("channel_alignment", "int8", [32], "channel_alignment.int8: expected a mapping, got a list of 1 items"),
    ],
)
def test_wrong_type(raw_platform, write_yaml, group, key, value, expected):
    data = raw_platform("rk3588")
    data[group][key] = value
    path = write_yaml(data, "rk3588.yaml")
    assert f"{path}: {expected}" in error_of(path)


@pytest.mark.parametrize(
    ("group", "key", "value", "expected"),
    [
        ("ddr", "read_bytes_per_cycle", 0, "ddr.read_bytes_per_cycle: expected a number > 0 and <= 1024, got 0"),
        ("ddr", "write_bytes_per_cycle", -2.5,
         "ddr.write_bytes_per_cycle: expected a number > 0 and <= 1024, got -2.5"),
        ("ddr", "read_bytes_per_cycle", float("nan"), "ddr.read_bytes_per_cycle: expected a number > 0"),
        ("cbuf", "banks", 16, "cbuf.banks: expected an integer in [1, 15], got 16"),
        ("cores", "count", 0, "cores.count: expected an integer in [1, 16], got 0"),
        ("pc", "register_address_bits", 40, "pc.register_address_bits: expected one of 32, got 40"),
        ("pc", "dma_address_bits", 31, "pc.dma_address_bits: expected an integer in [32, 64], got 31"),
        ("sparse", "modes", ["in_8_2"],
         "sparse.modes[0]: expected one of 'in_4_2', 'out_4_2', 'in_out_16_4', 'out_in_16_4', got 'in_8_2'"),
        ("cores", "split_ops", ["conv"],
         "cores.split_ops[0]: expected a string (an operator name such as 'Conv'), got 'conv'"),
    ],
)
def test_out_of_range(raw_platform, write_yaml, group, key, value, expected):
    data = raw_platform("rk3588")
    data[group][key] = value
    path = write_yaml(data, "rk3588.yaml")
    assert f"{path}: {expected}" in error_of(path)


def test_nested_row_out_of_range(raw_platform, write_yaml):
    data = raw_platform("rk3588")
    data["matmul"]["limits"]["int8"]["n_align"] = 0
    assert "matmul.limits.int8.n_align: expected an integer in [1, 1024], got 0" in error_of(write_yaml(data))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["cores"].update(parallel_batch_contexts=4),
         "cores.parallel_batch_contexts: expected at most cores.count (3), got 4"),
        (lambda d: d["pc"].update(task_number_bits=11),
         "pc.max_tasks_per_submit: expected at most 2**task_number_bits - 1 = 2047, got 4095"),
        (lambda d: d["sram"].update(size_bytes=5000),
         "sram.size_bytes: expected a multiple of granule_bytes (4096), got 5000"),
        (lambda d: d["sram"].update(kind="none"), "sram.size_bytes: expected 0 when kind is 'none'"),
        (lambda d: d["nc1hwc2"].update(int4=None), "nc1hwc2.int4: expected a C2: macs.int4 says"),
        (lambda d: d["matmul"]["layouts"].update(int4=None),
         "matmul.layouts.int4: expected a row: type_combinations uses int4"),
        (lambda d: d["matmul"].update(supported=False),
         "matmul.type_combinations: expected [] when supported is false"),
        (lambda d: d.update(aliases=["rk3588"]), "aliases: expected names other than the platform's own name"),
    ],
)
def test_contradicting_figures(raw_platform, write_yaml, edit, expected):
    data = raw_platform("rk3588")
    edit(data)
    path = write_yaml(data)
    assert f"{path}: {expected}" in error_of(path)


def test_unparseable_yaml_names_the_line(write_yaml):
    path = write_yaml("name: rk3588\ncores:\n  count: [1, 2\nclock: {}\n")
    message = error_of(path)
    assert message.startswith(f"{path}: line 4, column ")
    assert "invalid YAML" in message


def test_duplicate_key_is_an_error_with_its_line(raw_platform, write_yaml):
    text = (write_yaml(raw_platform("rk3588"), "base.yaml")).read_text()
    text = text.replace("ddr:\n", "ddr:\n  read_bytes_per_cycle: 99\n", 1)
    path = write_yaml(text)
    line = text.splitlines().index("  read_bytes_per_cycle: 5.887") + 1
    assert f"{path}: line {line}, column 3: invalid YAML: duplicate key 'read_bytes_per_cycle'" in error_of(path)


@pytest.mark.parametrize(("text", "expected"), [
    ("", "expected a mapping, got None"),
    ("- a\n- b\n", "expected a mapping, got a list of 2 items"),
    ("a: 1\n---\nb: 2\n", "invalid YAML"),
    ("x: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
])
def test_not_a_platform_document(write_yaml, text, expected):
    assert expected in error_of(write_yaml(text))


def test_missing_file_and_non_utf8(tmp_path):
    assert error_of(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: no such platform file"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    assert "expected UTF-8 text" in error_of(binary)


def test_huge_file_is_refused_without_parsing(write_yaml):
    path = write_yaml("a: " + "x" * MAX_YAML_BYTES)
    started = time.perf_counter()
    assert f"expected a platform YAML of at most {MAX_YAML_BYTES}" in error_of(path)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("text", [
    "[" * (MAX_YAML_BYTES - 1),  # nesting deeper than any parser stack
    "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "cores: {count: *d}\n",  # 'billion laughs': shared references, never expanded
    "cores: &c {count: 1, split_ops: *c}\n",  # a self-referencing mapping
])
def test_hostile_yaml_fails_fast(write_yaml, text):
    started = time.perf_counter()
    error_of(write_yaml(text))
    assert time.perf_counter() - started < 10.0
