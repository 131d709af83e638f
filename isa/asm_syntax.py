"""The words of the regcmd assembly text, shared by the assembler and the disassembler.

One line per command word::

    .task 0                      ; comment: everything after ';' is ignored
        CNA  CONV_CON1 = 0x00000020          ; a register write, raw value
        CNA  CONV_CON1 CONV_MODE=3 IN_PRECISION=0   ; the same by fields (others 0)
        TAIL PC BASE_ADDRESS = 0x00000440    ; TAIL only labels the tail words
        TAIL ZERO                            ; an all-zero word
        TAIL MARKER                          ; 0x0041000000000000
        TAIL OP_EN = 0x0000001d              ; or: OP_EN CNA CORE DPU DPU_RDMA
    .align 64                    ; zero words up to the next 64-byte boundary (8..65536)
    .zero 3                      ; three zero words (a buffer stays under 64 MiB)
    .word 0x0201000000001234     ; any raw 64-bit word
    .byte 0x01, 0x02             ; raw trailing bytes (a buffer that is not whole words)

Directives ``.map NAME`` and ``.base ADDR`` record the register map and the buffer's address.
``.chain [base=ADDR] [scale=N]`` switches to chain mode, where each
``.task enable=MASK|BLOCK,BLOCK [hi16=N]`` is followed by register writes only and the
assembler lays out the tails and padding itself (:func:`npuemu.isa.chain.encode_chain`).
"""

COMMENT = ";"
TAIL = "TAIL"
ZERO = "ZERO"
MARKER = "MARKER"
OP_EN = "OP_EN"
DIRECTIVES = (".map", ".base", ".task", ".align", ".zero", ".word", ".byte", ".chain")


def parse_int(text: str) -> int:
    """Decimal, 0x hex, 0b binary or 0o octal, optionally negative, ``_`` allowed."""
    return int(text, 0)
