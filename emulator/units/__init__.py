"""The NPU units: CNA+CORE, DPU+DPU_RDMA, PPU+PPU_RDMA (decoders and execution)."""
