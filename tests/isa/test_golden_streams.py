"""Golden test: our register map, word decoder and chain codec against the 13 RKNN streams.

docs/vendor-corpus/regcmd/*.txt print every 64-bit word of 13 real RK3588 regcmd blobs with
its target, block, register name, value and decoded fields (bits outside the listing's
fields as ``rsv=``), plus the 40-byte task records and their tails. For every word we check
that decoding gives the same target, block, register, field names, field values and
reserved bits, and that re-encoding gives the same word; then that the tails and fetch
amounts match the task table and that decoding and re-encoding each chain reproduces the
blob's bytes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from npuemu.isa.chain import decode_chain, encode_chain, fetch_amount
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.words import MARKER_WORD, WordKind, decode_word, encode_word, encode_write

LISTING_DIR = Path(__file__).parents[2] / ".." / "shared" / "docs" / "vendor-corpus" / "regcmd"
EXPECTED_LISTINGS = 13
EXPECTED_DISTINCT_NAMES = 153  # registers plus the ZERO / marker / op-enable pseudo-words
RKNN_SCALE = 2  # RK3588 PC fetch unit in words

_WORD = re.compile(
    r"^\s*(?P<index>\d+) (?P<word>[0-9a-f]{16}) (?P<tail>TAIL )?tgt=0x(?P<target>[0-9a-f]{4}) "
    r"(?P<block>\S+)\s+0x(?P<offset>[0-9A-Fa-f]{4}) (?P<name>.+?)\s+0x(?P<value>[0-9a-f]{8})\s*(?P<fields>.*)$"
)
_RECORD = re.compile(
    r"^#\s+task (?P<task>\d+)\s+chain (?P<chain>\d+) .*?enable_mask=0x(?P<enable>[0-9a-f]+) .*?"
    r"regcfg_amount=(?P<amount>\d+) regcmd_addr=0x(?P<addr>[0-9a-f]+) .*?\| tail: "
    r"next_addr=0x(?P<next_addr>[0-9a-f]+) next_amount_word=0x(?P<next_amount>[0-9a-f]+)"
)
_ZERO_RUN = re.compile(r"^\s+\.\.\. (\d+) zero word\(s\)")
_BLOB = re.compile(r"regcmd blob (\d+) words")


@dataclass(frozen=True)
class ListedWord:
    index: int
    word: int
    tail: bool
    target: int
    block: str
    offset: int
    name: str
    value: int
    fields: tuple[tuple[str, int], ...]
    reserved: int


@dataclass(frozen=True)
class Record:
    task: int
    chain: int
    enable_mask: int
    write_count: int
    address: int
    next_address: int
    next_amount_word: int


@dataclass(frozen=True)
class Listing:
    name: str
    words: tuple[ListedWord, ...]
    records: tuple[Record, ...]
    blob: bytes
    zero_run_words: int


def _listings() -> list[Path]:
    return sorted(LISTING_DIR.glob("*.txt")) if LISTING_DIR.is_dir() else []


def _require_listings() -> list[Path]:
    paths = _listings()
    if len(paths) != EXPECTED_LISTINGS:
        pytest.fail(
            f"expected {EXPECTED_LISTINGS} vendor regcmd listings in {LISTING_DIR.resolve()}, found "
            f"{len(paths)}; the golden test needs the shared docs checked out next to the repo"
        )
    return paths


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> Listing:
    text = path.read_text(encoding="utf-8")
    blob_match = _BLOB.search(text)
    assert blob_match, f"{path.name}: no 'regcmd blob N words' header"
    words, records, zero_runs = [], [], 0
    for line in text.splitlines():
        if match := _WORD.match(line):
            words.append(_listed_word(match))
        elif match := _RECORD.match(line):
            records.append(Record(int(match["task"]), int(match["chain"]), int(match["enable"], 16),
                                  int(match["amount"]), int(match["addr"], 16),
                                  int(match["next_addr"], 16), int(match["next_amount"], 16)))
        elif match := _ZERO_RUN.match(line):
            zero_runs += int(match.group(1))
    size = int(blob_match.group(1))
    image = [0] * size
    for listed in words:
        image[listed.index] = listed.word
    blob = b"".join(w.to_bytes(8, "little") for w in image)
    return Listing(path.stem, tuple(words), tuple(records), blob, zero_runs)


def _listed_word(match: re.Match) -> ListedWord:
    fields, reserved = [], 0
    for token in match["fields"].split():
        key, value = token.split("=")
        if key == "rsv":
            reserved = int(value, 16)
        else:
            fields.append((key, int(value)))
    return ListedWord(int(match["index"]), int(match["word"], 16), bool(match["tail"]),
                      int(match["target"], 16), match["block"], int(match["offset"], 16),
                      match["name"], int(match["value"], 16), tuple(fields), reserved)


@pytest.fixture(scope="module")
def regmap():
    return load_regmap("rk3588")


def test_all_listings_are_present():
    assert len(_require_listings()) == EXPECTED_LISTINGS


@pytest.mark.parametrize("index", range(EXPECTED_LISTINGS))
def test_listing_is_parsed_completely(index):
    listing = _parse(_require_listings()[index])
    assert listing.words and listing.records
    # Every word of the blob is either printed or inside a summarised zero run.
    assert len(listing.words) + listing.zero_run_words == len(listing.blob) // 8
    for listed in listing.words:
        assert (listed.target, listed.value, listed.offset) == (
            listed.word >> 48, (listed.word >> 16) & 0xFFFFFFFF, listed.word & 0xFFFF)


@pytest.mark.parametrize("index", range(EXPECTED_LISTINGS))
def test_every_word_decodes_like_the_listing(index, regmap):
    listing = _parse(_require_listings()[index])
    for listed in listing.words:
        where = f"{listing.name} word {listed.index} ({listed.name})"
        decoded = decode_word(listed.word, regmap)
        assert decoded.target == listed.target, where
        assert encode_word(decoded.target, decoded.value, decoded.offset) == listed.word, where
        if listed.block == "PAD":
            assert decoded.kind is WordKind.ZERO, where
        elif listed.block == "MARK41":
            assert decoded.kind is WordKind.MARKER and listed.word == MARKER_WORD, where
        elif listed.block == "OP_EN":
            assert decoded.kind is WordKind.OP_ENABLE, where
            ours = tuple((name, decoded.value >> bit & 1) for bit, name in regmap.op_enable_blocks.items())
            assert ours == listed.fields, where
        else:
            _check_write(listed, decoded, regmap, where)


def _check_write(listed, decoded, regmap, where):
    assert decoded.kind is WordKind.WRITE, f"{where}: {decoded.problem}"
    assert decoded.block == listed.block, where
    assert f"{decoded.block}.{decoded.register}" == listed.name, where
    register = regmap.register(decoded.block, decoded.register)
    assert tuple(register.unpack(listed.value).items()) == listed.fields, where
    assert register.reserved_bits(listed.value) == listed.reserved, where
    assert encode_write(regmap, decoded.block, decoded.register, listed.value) == listed.word, where


def test_every_listed_register_name_is_in_the_map(regmap):
    names = {listed.name for path in _require_listings() for listed in _parse(path).words}
    assert len(names) == EXPECTED_DISTINCT_NAMES
    pseudo = {n for n in names if "." not in n or "(" in n}
    assert pseudo == {"ZERO", "MARKER_0041(required before op_en)",
                      "PC.OPERATION_ENABLE(op_en word: block bitmap)"}
    for name in names - pseudo:
        block, register = name.split(".")
        regmap.register(block, register)  # raises EncodingError if missing


@pytest.mark.parametrize("index", range(EXPECTED_LISTINGS))
def test_tails_match_the_task_table(index, regmap):
    listing = _parse(_require_listings()[index])
    words = {listed.index: listed for listed in listing.words}
    tail_indices = set()
    for record in listing.records:
        first = record.address // 8 + record.write_count
        link, amounts, marker, enable = (words[first + i] for i in range(4))
        tail_indices.update(range(first, first + 4))
        if record.next_amount_word == 0:
            assert link.word == 0 and record.next_address == 0
        else:
            assert link.name == "PC.BASE_ADDRESS" and link.value == record.next_address
        assert amounts.name == "PC.REGISTER_AMOUNTS" and amounts.value == record.next_amount_word
        assert marker.word == MARKER_WORD
        assert enable.block == "OP_EN" and enable.value == record.enable_mask
    assert tail_indices == {listed.index for listed in listing.words if listed.tail}


def _linked(listing: Listing, start: Record) -> list[Record]:
    """The records the PC walks from ``start`` by following the tails.

    Records of different chains may share a block, and a shared block's tail links where
    its first user's chain goes (rep11: chain 1 starts in chain 0's block at 0x0, whose
    tail leads to chain 0's task at 0x280), so links are followed by address, not by the
    table's chain number.
    """
    by_address = {r.address: r for r in listing.records}
    sequence = [start]
    while sequence[-1].next_amount_word:
        sequence.append(by_address[sequence[-1].next_address])
    return sequence


def test_linked_tails_exist():
    # Guards the per-listing loop below against passing vacuously (single-task listings).
    linked = [r for path in _require_listings() for r in _parse(path).records if r.next_amount_word]
    assert len(linked) >= 40


@pytest.mark.parametrize("index", range(EXPECTED_LISTINGS))
def test_next_amount_formula(index):
    listing = _parse(_require_listings()[index])
    by_address = {r.address: r for r in listing.records}
    linked = [r for r in listing.records if r.next_amount_word]
    for record in linked:
        following = by_address[record.next_address]
        expected = -(-(following.write_count + 4) // 2) - 1  # ceil((n + 4) / 2) - 1
        assert record.next_amount_word & 0xFFFF == expected == fetch_amount(following.write_count, RKNN_SCALE)


@pytest.mark.parametrize("index", range(EXPECTED_LISTINGS))
def test_chains_decode_and_reencode_to_the_same_bytes(index, regmap):
    listing = _parse(_require_listings()[index])
    starts: dict[int, Record] = {}
    for record in sorted(listing.records, key=lambda r: r.task):
        starts.setdefault(record.chain, record)
    for chain_id, start in starts.items():
        records = _linked(listing, start)
        decoded = decode_chain(listing.blob, regmap, 0, start.address,
                               fetch_amount(start.write_count, RKNN_SCALE))
        tasks = decoded.chain.tasks
        assert decoded.task_addresses == tuple(r.address for r in records), chain_id
        assert tuple(len(t.writes) for t in tasks) == tuple(r.write_count for r in records)
        assert tuple(t.enable_mask for t in tasks) == tuple(r.enable_mask for r in records)
        assert tuple(t.amount_hi16 for t in tasks) == tuple(r.next_amount_word >> 16 for r in records)
        encoded = encode_chain(decoded.chain, regmap, base_addr=start.address)
        assert encoded.task_addresses == decoded.task_addresses
        assert encoded.data == listing.blob[start.address:start.address + len(encoded.data)], chain_id
