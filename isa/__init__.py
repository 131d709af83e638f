"""The RKNPU register-command ISA: command words, register maps, tasks and chains,
assembler/disassembler, the model container, and the memory formats the compiler writes and
the emulator reads (``weight_layout``: weight and BS operand blobs, int4 packing;
``lut_format``: DPU look-up tables; ``tensor_layout``: NC1HWC2 feature maps). Pure data and
encoding: no numerics."""
