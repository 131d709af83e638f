"""Load register maps from YAML (``isa/regmaps/<family>.yaml``), full or as a delta.

A full map lists every block and register. A delta map names its ``base`` map and lists
``remove`` (``BLOCK.REGISTER`` names), ``change`` (``BLOCK.REGISTER`` -> keys to replace:
offset, doc, source, fields), ``add`` (``BLOCK.REGISTER`` -> a new register) and
``add_blocks``; top-level keys (status, pc_amount_scale, description, sources) override the
base's. Every problem is a :class:`ConfigError` naming the file and the key path.
"""

from __future__ import annotations

import copy
import functools
import logging
import re
from pathlib import Path
from typing import Any

import yaml

from npuemu.isa import yaml_cache
from npuemu.isa.errors import ConfigError
from npuemu.isa.regmap import Block, Field, Register, RegisterMap
from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE

log = logging.getLogger(__name__)

REGMAP_DIR = Path(__file__).with_name("regmaps")
_SHIPPED_LOADER = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SOURCE_KEY = re.compile(r"^[A-Za-z0-9_]+")
_TOP_KEYS = {"family", "status", "description", "pc_amount_scale", "sources", "blocks"}
_DELTA_KEYS = {"base", "remove", "change", "add", "add_blocks", "notes"}
_BLOCK_KEYS = {"base", "target", "op_enable_bit", "source", "doc", "registers"}
_REGISTER_KEYS = {"offset", "doc", "source", "fields"}
_FIELD_KEYS = {"bits", "signed", "doc", "source"}
_BLOCK_WINDOW = 0x1000
REQUIRED_PC_REGISTERS = ("BASE_ADDRESS", "REGISTER_AMOUNTS")  # the chain tail writes them


def available_regmaps() -> list[str]:
    return sorted(p.stem for p in REGMAP_DIR.glob("*.yaml"))


def load_regmap(name_or_path: str | Path) -> RegisterMap:
    """A register map by family name (``"rk3588"``) or by path to a YAML file."""
    return _load_cached(str(_resolve(name_or_path, REGMAP_DIR)))


@functools.lru_cache(maxsize=32)
def _load_cached(path: str) -> RegisterMap:
    raw = _load_raw(Path(path), seen=())
    regmap = _build(raw, Path(path))
    log.debug("loaded register map %s from %s", regmap.family, path)
    return regmap


def _resolve(name_or_path: str | Path, directory: Path) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.is_absolute() and not path.exists():
            path = directory / path
    else:
        path = directory / f"{text}.yaml"
        if not path.exists():
            path = REGMAP_DIR / f"{text}.yaml"
        if not path.exists():
            raise ConfigError(
                f"no register map named {text!r}; available: {', '.join(available_regmaps())}"
            )
    if not path.exists():
        raise ConfigError(f"{path}: register map file not found")
    return path.resolve()


# -- raw YAML, with delta maps applied onto their base -------------------------------------
def _load_raw(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if path in seen:
        chain = " -> ".join(p.name for p in (*seen, path))
        raise ConfigError(f"{path}: register maps include each other in a loop: {chain}")
    try:
        text = path.read_text(encoding="utf-8")
        # the shipped maps through libyaml (tests/platforms/test_shipped_yaml.py checks them strictly)
        shipped = path.resolve().parent == REGMAP_DIR.resolve()
        # (their parsed data kept beside the bytecode cache: isa/yaml_cache.py, issue 20's first call)
        doc = yaml_cache.load(text, _SHIPPED_LOADER, path) if shipped else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read register map: {error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    _expect(isinstance(doc, dict), path, "", "a mapping at the top level")
    if "base" not in doc:
        _check_keys(doc, _TOP_KEYS, path, "")
        _expect("blocks" in doc, path, "", "a 'blocks' mapping (or 'base' for a delta map)")
        return copy.deepcopy(doc)
    _check_keys(doc, (_TOP_KEYS - {"blocks"}) | _DELTA_KEYS, path, "")
    _expect(isinstance(doc["base"], str), path, "base", "the name of the base map")
    raw = _load_raw(_resolve(doc["base"], path.parent), (*seen, path))
    _apply_delta(raw, doc, path)
    return raw


def _apply_delta(raw: dict[str, Any], delta: dict[str, Any], path: Path) -> None:
    for key in ("family", "status", "description", "pc_amount_scale"):
        if key in delta:
            raw[key] = delta[key]
    raw["sources"] = {**raw.get("sources", {}), **(delta.get("sources") or {})}
    blocks = raw["blocks"]
    for index, qualified in enumerate(delta.get("remove") or []):
        block, name = _split_qualified(qualified, blocks, path, f"remove[{index}]")
        _expect(name in blocks[block]["registers"], path, f"remove[{index}]",
                f"a register of the base map, {qualified} is not one")
        del blocks[block]["registers"][name]
    for qualified, changes in (delta.get("change") or {}).items():
        where = f"change.{qualified}"
        block, name = _split_qualified(qualified, blocks, path, where)
        _expect(name in blocks[block]["registers"], path, where, "a register of the base map")
        _expect(isinstance(changes, dict), path, where, "a mapping of register keys")
        _check_keys(changes, _REGISTER_KEYS, path, where)
        blocks[block]["registers"][name] = {**blocks[block]["registers"][name], **copy.deepcopy(changes)}
    for qualified, register in (delta.get("add") or {}).items():
        where = f"add.{qualified}"
        block, name = _split_qualified(qualified, blocks, path, where)
        _expect(name not in blocks[block]["registers"], path, where,
                "a register the base map lacks (use 'change' to modify one)")
        blocks[block]["registers"][name] = copy.deepcopy(register)
    for name, block in (delta.get("add_blocks") or {}).items():
        _expect(name not in blocks, path, f"add_blocks.{name}", "a block the base map lacks")
        blocks[name] = copy.deepcopy(block)


def _split_qualified(qualified: Any, blocks: dict, path: Path, where: str) -> tuple[str, str]:
    _expect(isinstance(qualified, str) and qualified.count(".") == 1, path, where,
            "a 'BLOCK.REGISTER' name")
    block, name = qualified.split(".")
    _expect(block in blocks, path, where, f"a block of the base map ({', '.join(blocks)})")
    return block, name


# -- validation and construction -----------------------------------------------------------
def _build(raw: dict[str, Any], path: Path) -> RegisterMap:
    family = raw.get("family")
    _expect(isinstance(family, str) and family, path, "family", "a family name")
    status = raw.get("status", "complete")
    _expect(status in ("complete", "partial"), path, "status", "'complete' or 'partial'")
    scale = raw.get("pc_amount_scale")
    _expect(_is_int(scale) and scale in (1, 2, 4, 8), path, "pc_amount_scale",
            "1, 2, 4 or 8 (words per PC fetch unit)")
    sources = raw.get("sources") or {}
    _expect(isinstance(sources, dict) and all(isinstance(v, str) for v in sources.values()),
            path, "sources", "a mapping of source key -> description")
    blocks_raw = raw["blocks"]
    _expect(isinstance(blocks_raw, dict) and blocks_raw, path, "blocks", "a non-empty mapping")
    blocks = tuple(_build_block(name, spec, sources, path) for name, spec in blocks_raw.items())
    _check_unique(blocks, path)
    regmap = RegisterMap(family=family, status=status, pc_amount_scale=scale, blocks=blocks,
                         sources=dict(sources), description=str(raw.get("description", "")),
                         path=str(path))
    _expect("PC" in blocks_raw, path, "blocks", "a PC block")
    pc_names = {r.name for r in regmap.block("PC").registers}
    for name in REQUIRED_PC_REGISTERS:
        _expect(name in pc_names, path, f"blocks.PC.registers.{name}",
                "present (the task tail writes it)")
    return regmap


def _build_block(name: str, spec: Any, sources: dict, path: Path) -> Block:
    where = f"blocks.{name}"
    _expect(isinstance(name, str) and _NAME.match(name), path, where, "an upper-case block name")
    _expect(isinstance(spec, dict), path, where, "a mapping")
    _check_keys(spec, _BLOCK_KEYS, path, where)
    base, target = spec.get("base"), spec.get("target")
    _expect(_is_int(base) and 0 <= base <= 0xF000 and base % _BLOCK_WINDOW == 0, path,
            f"{where}.base", "a multiple of 0x1000 in 0x0000..0xF000")
    _expect(_is_int(target) and 0 < target <= 0xFFFF and target not in (TARGET_MARKER, TARGET_OP_ENABLE),
            path, f"{where}.target", "a 16-bit write-target code other than 0x0041 and 0x0081")
    bit = spec.get("op_enable_bit")
    _expect(bit is None or (_is_int(bit) and 0 <= bit <= 31), path, f"{where}.op_enable_bit",
            "a bit number 0..31")
    source = spec.get("source", "")
    if "source" in spec:
        _check_source(source, sources, path, f"{where}.source")
    registers_raw = spec.get("registers")
    _expect(isinstance(registers_raw, dict) and registers_raw, path, f"{where}.registers",
            "a non-empty mapping")
    registers = tuple(
        _build_register(name, reg_name, reg_spec, base, source, sources, path)
        for reg_name, reg_spec in registers_raw.items()
    )
    offsets: dict[int, str] = {}
    for register in registers:
        other = offsets.setdefault(register.offset, register.name)
        _expect(other == register.name, path, f"{where}.registers.{register.name}.offset",
                f"an offset not used by another register ({register.offset:#06x} is {other}'s)")
    return Block(name=name, base=base, target=target, op_enable_bit=bit,
                 registers=tuple(sorted(registers, key=lambda r: r.offset)),
                 doc=str(spec.get("doc", "")), source=source)


def _build_register(block: str, name: Any, spec: Any, base: int, block_source: str,
                    sources: dict, path: Path) -> Register:
    where = f"blocks.{block}.registers.{name}"
    _expect(isinstance(name, str) and _NAME.match(name), path, where, "an upper-case register name")
    _expect(isinstance(spec, dict), path, where, "a mapping")
    _check_keys(spec, _REGISTER_KEYS, path, where)
    offset = spec.get("offset")
    _expect(_is_int(offset) and base <= offset < base + _BLOCK_WINDOW and offset % 4 == 0,
            path, f"{where}.offset", f"a multiple of 4 in the block window {base:#06x}..{base + 0xFFC:#06x}")
    source = spec.get("source") or block_source
    _check_source(source, sources, path, f"{where}.source")
    fields_raw = spec.get("fields")
    _expect(isinstance(fields_raw, dict) and fields_raw, path, f"{where}.fields", "a non-empty mapping")
    fields = [_build_field(f_name, f_spec, source, sources, path, f"{where}.fields.{f_name}")
              for f_name, f_spec in fields_raw.items()]
    _check_overlap(fields, path, f"{where}.fields")
    return Register(block=block, name=name, offset=offset,
                    fields=tuple(sorted(fields, key=lambda f: -f.lsb)),
                    doc=str(spec.get("doc", "")), source=source)


def _build_field(name: Any, spec: Any, register_source: str, sources: dict, path: Path,
                 where: str) -> Field:
    _expect(isinstance(name, str) and _NAME.match(name), path, where, "an upper-case field name")
    if not isinstance(spec, dict):
        spec = {"bits": spec}
    _check_keys(spec, _FIELD_KEYS, path, where)
    bits = spec.get("bits")
    if _is_int(bits):
        bits = [bits, bits]
    _expect(isinstance(bits, list) and len(bits) == 2 and all(_is_int(b) for b in bits)
            and 31 >= bits[0] >= bits[1] >= 0, path, f"{where}.bits",
            f"a bit number or [msb, lsb] with 31 >= msb >= lsb >= 0, got {spec.get('bits')!r}")
    signed = spec.get("signed", False)
    _expect(isinstance(signed, bool), path, f"{where}.signed", "true or false")
    _expect(not signed or bits[0] > bits[1], path, f"{where}.signed", "a field of 2 or more bits")
    source = spec.get("source") or register_source
    _check_source(source, sources, path, f"{where}.source")
    return Field(name=name, lsb=bits[1], msb=bits[0], signed=signed,
                 doc=str(spec.get("doc", "")), source=source)


def _check_overlap(fields: list[Field], path: Path, where: str) -> None:
    taken: dict[int, str] = {}
    for f in fields:
        for bit in range(f.lsb, f.msb + 1):
            other = taken.setdefault(bit, f.name)
            _expect(other == f.name, path, f"{where}.{f.name}",
                    f"bits not shared with another field (bit {bit} is also {other}'s)")


def _check_unique(blocks: tuple[Block, ...], path: Path) -> None:
    for attribute in ("base", "target", "op_enable_bit"):
        seen: dict[int, str] = {}
        for block in blocks:
            value = getattr(block, attribute)
            if value is None:
                continue
            other = seen.setdefault(value, block.name)
            _expect(other == block.name, path, f"blocks.{block.name}.{attribute}",
                    f"a value no other block uses ({value:#x} is also {other}'s)")


def _check_source(source: Any, sources: dict, path: Path, where: str) -> None:
    match = _SOURCE_KEY.match(source) if isinstance(source, str) else None
    _expect(match is not None and match.group(0) in sources, path, where,
            f"a source starting with one of the keys {', '.join(sources) or '(none defined)'}; "
            f"got {source!r}")


def _check_keys(spec: dict, allowed: set[str], path: Path, where: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    _expect(not unknown, path, where or "top level",
            f"only the keys {', '.join(sorted(allowed))}; unknown: {', '.join(unknown)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(condition: bool, path: Path, where: str, expected: str) -> None:
    if not condition:
        raise ConfigError(f"{path}: {where or 'top level'}: expected {expected}")
