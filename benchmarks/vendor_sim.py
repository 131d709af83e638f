"""The vendor simulator's CPU time on the benchmark networks, beside onnxruntime's (issue 20's
"vendor sim" column), for the Python environment that has rknn-toolkit2 - not npuemu's:

    python -m benchmarks.bitexact build DIR            # npuemu's env: writes DIR/<model>.onnx
    /path/to/rknn-venv/bin/python benchmarks/vendor_sim.py DIR/mobilenetv2.onnx [...]

rknn-toolkit2 2.5.0 installs from PyPI (about 5 GB with its dependencies); keep it out of npuemu's
environment. Each model is built for rk3588 with int8 quantization on one random input (seed 0,
as the benchmark's input), then run 5 times on the simulator (``init_runtime()`` without a
target); the figure is the minimum process CPU time, and onnxruntime's is taken the same way on one
intra-op thread. Set OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 for single-thread figures.
"""

import os
import sys
import tempfile
import time

import numpy as np


def cpu_ms(run, repeat: int = 5) -> float:
    run()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times) * 1000


def measure(onnx_path: str) -> tuple[float, float]:
    import onnx
    import onnxruntime as ort
    from rknn.api import RKNN

    dims = [d.dim_value for d in onnx.load(onnx_path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "x.npy"), x)
        with open(os.path.join(tmp, "ds.txt"), "w") as f:
            f.write(os.path.join(tmp, "x.npy") + "\n")
        rknn = RKNN(verbose=False)
        rknn.config(target_platform="rk3588")
        if rknn.load_onnx(model=onnx_path) != 0 or rknn.build(do_quantization=True, dataset=os.path.join(tmp, "ds.txt")) != 0:
            raise SystemExit(f"{onnx_path}: the vendor's build failed")
        if rknn.init_runtime() != 0:
            raise SystemExit(f"{onnx_path}: the vendor simulator did not start")
        vendor = cpu_ms(lambda: rknn.inference(inputs=[x], data_format="nchw"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options)
    feed = {session.get_inputs()[0].name: x}
    return vendor, cpu_ms(lambda: session.run(None, feed))


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        vendor, ort_ms = measure(path)
        name = os.path.splitext(os.path.basename(path))[0]
        print(f"{name}: vendor simulator {vendor:.1f} ms CPU, onnxruntime {ort_ms:.2f} ms, ratio {vendor / ort_ms:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
