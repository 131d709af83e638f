"""The RKNPU register-command ISA: command words, register maps, tasks and chains,
assembler/disassembler and the model container. Pure data and encoding: no numerics."""
