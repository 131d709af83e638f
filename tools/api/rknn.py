"""``npuemu.api.RKNN``: rknn-toolkit2's Python API (``rknn.api.RKNN``) on npuemu.

A vendor script runs with its import line changed to ``from npuemu.api import RKNN``
(guide 3.1-3.2, 4.1, 6.3). Models are built by npuemu's compiler driver and run on the
emulated NPU; no board is ever contacted, so ``eval_perf`` and ``eval_memory``, which the
vendor's toolkit only runs on a connected board, work here on the emulated chip.

Return conventions follow the vendor: methods return 0 on success; a user's mistake is one
logged error line (``E <method>: ...``) and -1 (``inference``, ``eval_perf`` and
``eval_memory``, which return data, return None), never a traceback. Arguments npuemu cannot
honour yet are refused by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npuemu.isa.errors import ConfigError, InputError, NpuemuError

from . import building, logs, snapshot
from .config import ApiConfig, check_unsupported, core_mask_text, make_config
from .session import NpuSession, RknnSession, check_rknn_core_mask


def _api(failure: Any = -1) -> Callable:
    """Run an API method; a user's mistake (NpuemuError, OSError) becomes one logged error line
    and ``failure``, as the vendor's methods return -1 instead of raising."""
    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def run(self: RKNN, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except (NpuemuError, OSError) as error:
                text = str(error) if isinstance(error, NpuemuError) else f"{error.filename or ''}: {error.strerror}"
                logs.method_log(method.__name__).error(" ".join(text.split()))
                return failure
        return run
    return wrap


def _refuse(**given: Any) -> None:
    """Refuse, by name, the first argument given a value other than its default (the defaults
    are in the keyword: ``name=(value, default, why)``)."""
    for name, (value, default, why) in given.items():
        if value != default:
            raise ConfigError(f"{name}={value!r} is not supported by npuemu: {why}")


class RKNN:
    """rknn-toolkit2's ``RKNN`` object on npuemu (guide 3.1.1: ``RKNN(verbose, verbose_file)``)."""

    NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2 = 0, 1, 2, 4
    NPU_CORE_0_1, NPU_CORE_0_1_2, NPU_CORE_ALL = 3, 7, 0xFFFF

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        self._file_log = logs.setup(verbose, verbose_file)
        self._config = ApiConfig()
        self._source: building.Source | None = None
        self._front = None  # the driver's Front of an ONNX build (None after load_rknn)
        self._model = None  # npuemu ModelFile, or a vendor RknnModel after load_rknn
        self._model_path: str | None = None
        self._batch_size = 1
        self._session: NpuSession | RknnSession | None = None
        self._perf_debug = self._eval_mem = False

    # --- model conversion (guide 3.1) ---------------------------------------------------------

    @_api()
    def config(self, mean_values: Any = None, std_values: Any = None, quantized_dtype: str = "asymmetric_quantized-8",
               quantized_algorithm: str = "normal", quantized_method: str = "channel",
               quantized_hybrid_level: int = 0, target_platform: str | None = None, quant_img_RGB2BGR: bool = False,
               float_dtype: str = "float16", optimization_level: int = 3, custom_string: str | None = None,
               remove_weight: bool = False, compress_weight: bool = False, inputs_yuv_fmt: Any = None,
               single_core_mode: bool = False, dynamic_input: Any = None, model_pruning: bool = False,
               op_target: Any = None, quantize_weight: bool = False, remove_reshape: bool = False,
               sparse_infer: bool = False, enable_flash_attention: bool = False) -> int:
        """Guide 3.1.2: mean/std per input, RGB2BGR for calibration images, the chip (npuemu's
        platform names and aliases), the quantization algorithm and method, the optimization
        level, a custom string (stored in the model file's ``extra``) and single-core mode.
        The other documented arguments are refused by name unless left at their defaults."""
        check_unsupported({"quantized_hybrid_level": quantized_hybrid_level,
                           "float_dtype": float_dtype,
                           "quantize_weight": quantize_weight, "remove_weight": remove_weight,
                           "compress_weight": compress_weight,
                           "inputs_yuv_fmt": inputs_yuv_fmt, "op_target": op_target,
                           "remove_reshape": remove_reshape, "enable_flash_attention": enable_flash_attention})
        self._config = make_config(mean_values, std_values, quant_img_RGB2BGR, target_platform, quantized_dtype,
                                   quantized_algorithm, quantized_method, optimization_level, custom_string,
                                   single_core_mode, sparse_infer=sparse_infer, dynamic_input=dynamic_input,
                                   model_pruning=model_pruning)
        if not self._config.platform_given:
            logs.method_log("config").info(f"target_platform not given: building for {self._config.target_platform}")
        return 0

    @_api()
    def load_onnx(self, model: str, inputs: list[str] | None = None, input_size_list: list | None = None,
                  input_initial_val: Any = None, outputs: list[str] | None = None) -> int:
        """Guide 3.1.3: read an ONNX model; ``inputs``/``outputs`` naming inner tensors cut the
        graph there; ``input_size_list`` fixes the input shapes (NCHW, the ONNX layout);
        ``input_initial_val`` fixes inputs to constants (one value or None per input)."""
        self._source = building.load_source(model, inputs, input_size_list, outputs, input_initial_val)
        self._front = self._model = self._session = None
        return 0

    @_api()
    def build(self, do_quantization: bool = True, dataset: str | None = None, rknn_batch_size: int | None = None) -> int:
        """Guide 3.1.4, 5.6: int8 calibrated on ``dataset`` (``do_quantization=True``) or float16,
        with ``rknn_batch_size`` batch contexts; the model stays in memory until ``export_rknn``."""
        source = self._need_source("build")
        if not do_quantization and dataset is not None:
            logs.method_log("build").warning(f"dataset {dataset} is not used: do_quantization=False builds float16")
            dataset = None
        self._batch_size = _batch(rknn_batch_size)
        front = building.build_front(source, self._config, bool(do_quantization), dataset, self._batch_size)
        if front.sparse_note:  # sparse_infer on a float16 build: ignored, as the vendor does
            logs.method_log("build").warning(front.sparse_note)
        self._model = building.build_model_file(front, self._config)
        self._front, self._model_path, self._session = front, None, None
        logs.method_log("build").info(f"built {source.name} for {front.platform.name} ({front.quantization.mode})")
        return 0

    @_api()
    def hybrid_quantization_step1(self, dataset: str | None = None, rknn_batch_size: int | None = None,
                                  proposal: bool = False, proposal_dataset_size: int = 1) -> int:
        """Guide 6.3.2 step 1: calibrate and write ``{name}.model``, ``{name}.data`` and
        ``{name}.quantization.cfg`` in the current folder. The config is npuemu's per-layer YAML
        (compiler/quant/config.py): set a layer's ``dtype: float16`` to move it off int8.
        ``proposal=True`` writes the float16 layers ``compile --auto-hybrid`` chooses (its
        default target), checked on the first ``proposal_dataset_size`` dataset samples."""
        _refuse(proposal_dataset_size=(proposal_dataset_size if not proposal else 1, 1,
                                       "it only applies to proposal=True"))
        if proposal and (not isinstance(proposal_dataset_size, int) or proposal_dataset_size < 1):
            raise ConfigError(f"proposal_dataset_size={proposal_dataset_size!r}: expected a count of 1 or more")
        source = self._need_source("hybrid_quantization_step1")
        paths = building.hybrid_step1(source, self._config, dataset, _batch(rknn_batch_size), Path.cwd(),
                                      proposal_dataset_size if proposal else None)
        logs.method_log("hybrid_quantization_step1").info("wrote " + ", ".join(str(p.name) for p in paths))
        return 0

    @_api()
    def hybrid_quantization_step2(self, model_input: str, data_input: str, model_quantization_cfg: str) -> int:
        """Guide 6.3.2 step 3: build from step 1's files with the edited config (int8 and
        float16 layers, DataConvert steps between them)."""
        source, front, data = building.hybrid_step2(model_input, data_input, model_quantization_cfg)
        if self._config.platform_given and self._config.target_platform != front.platform.name:
            raise ConfigError(f"config(target_platform={self._config.target_platform!r}) but step 1 calibrated for "
                              f"{front.platform.name}; run step 1 again for that chip")
        config = ApiConfig(target_platform=front.platform.name, custom_string=data.get("custom_string"),
                           single_core_mode=self._config.single_core_mode)
        self._model = building.build_model_file(front, config)
        self._source, self._front, self._config = source, front, config
        self._batch_size, self._model_path, self._session = int(data.get("batch_size") or 1), None, None
        return 0

    @_api()
    def export_rknn(self, export_path: str, cpp_gen_cfg: bool = False) -> int:
        """Guide 3.1.5. Writes **npuemu's model file** (the ``.npu`` container, isa/CONTAINER.md)
        under the given name: the vendor's .rknn writer is not reproduced. ``load_rknn`` here,
        and ``npuemu run/perf/mem/inspect``, read it back; the vendor's runtime cannot."""
        _refuse(cpp_gen_cfg=(cpp_gen_cfg, False, "no C++ deployment example is generated"))
        if self._model is None:
            raise ConfigError("nothing to export: build() (or hybrid_quantization_step2) first")
        if not hasattr(self._model, "write"):
            raise ConfigError("a vendor .rknn file loaded by load_rknn is not re-exported; copy the file instead")
        self._model.write(export_path)
        logs.method_log("export_rknn").warning(
            f"wrote {export_path} as an npuemu model file (.npu format), not a vendor .rknn: load_rknn and "
            "`npuemu run/perf/mem` read it; the vendor's runtime does not")
        return 0

    @_api()
    def load_rknn(self, path: str) -> int:
        """Guide 3.1 (the .rknn path of the flow): a vendor ``.rknn`` file (RK3588, run as its
        chain 0 on core 0, emulator/rknn_runner.py) or an npuemu model file from ``export_rknn``."""
        from npuemu.isa.container import ModelFile
        from npuemu.isa.container_format import RKNN_MAGIC

        with open(path, "rb") as handle:
            head = handle.read(len(RKNN_MAGIC))
        if head == RKNN_MAGIC:
            from npuemu.isa.rknn import load_rknn
            self._model = load_rknn(path)
        else:
            self._model = ModelFile.read(path)
        self._model_path, self._front, self._source, self._session = str(path), None, None, None
        return 0

    def _need_source(self, method: str) -> building.Source:
        if self._source is None:
            raise ConfigError(f"{method} needs a model: call load_onnx(model=...) first")
        return self._source

    # --- evaluation on the emulated NPU (guide 3.2) -------------------------------------------

    @_api()
    def init_runtime(self, target: str | None = None, target_sub_class: str | None = None, device_id: str | None = None,
                     perf_debug: bool = False, eval_mem: bool = False, async_mode: bool = False,
                     core_mask: int = NPU_CORE_AUTO, fallback_prior_device: str = "cpu") -> int:
        """Guide 3.2.1, 5.3: load the model on the emulated NPU. ``target`` names the emulated
        chip (None: the chip it was built for; another chip is refused, as the vendor refuses a
        model built for another platform); ``core_mask`` picks the cores (an ONNX build is
        rebuilt with that split, since npuemu compiles it in); ``perf_debug`` makes ``eval_perf``
        print every layer; ``eval_mem`` enables ``eval_memory``. No board is contacted."""
        _refuse(device_id=(device_id, None, "no board is contacted; the emulated chip is `target`"),
                target_sub_class=(target_sub_class, None, "sub-classes of a target are not modelled"),
                async_mode=(async_mode, False, "the emulator runs each inference to completion"),
                fallback_prior_device=(fallback_prior_device, "cpu", "the partition decides where layers run"))
        if self._model is None:
            raise ConfigError("no model: build() or load_rknn() first")
        mask = core_mask_text(core_mask)
        self._session = self._new_session(target, mask)
        self._perf_debug, self._eval_mem = bool(perf_debug), bool(eval_mem)
        logs.method_log("init_runtime").info(f"emulated {self._session.chip} (no board), core mask {mask}")
        return 0

    def _new_session(self, target: str | None, mask: str) -> NpuSession | RknnSession:
        from npuemu.platforms import resolve_name

        if not hasattr(self._model, "write"):  # a vendor .rknn file
            check_rknn_core_mask(mask)
            return RknnSession(self._model, self._model_path, resolve_name(target or self._model.target or "rk3588"))
        built = self._model.platform().chip
        if target is not None and resolve_name(target) != resolve_name(built):
            raise ConfigError(f"target {target!r}: the model was built for {built}; build it again with "
                              f"config(target_platform={target!r}) to emulate that chip")
        if self._config.single_core_mode and mask not in ("auto", "0", "1", "2"):
            raise ConfigError(f"core_mask {mask}: config(single_core_mode=True) builds a single-core model")
        if self._front is not None:
            if self._model_mask() != mask:  # the core split is compiled in: build that variant
                self._model = building.build_model_file(self._front, self._config, mask)
        elif self._model_mask() not in (mask, None) and mask != "auto":
            raise ConfigError(f"core_mask {mask}: {self._model_path} was built with core mask {self._model_mask()}, "
                              "which is compiled into the file; build the model again to run another split")
        return NpuSession(self._model, self._model_path)

    def _model_mask(self) -> str | None:
        return (self._model.compiler().options or {}).get("core_mask")

    @_api(failure=None)
    def inference(self, inputs: list, data_type: Any = None, data_format: Any = None, inputs_pass_through: Any = None,
                  get_frame_id: bool = False) -> list | None:
        """Guide 3.2.1: run one inference on the emulated NPU. ``inputs``: one array per input,
        4-D ones NHWC unless ``data_format`` says 'nchw' (one text, or one per input); an image
        may be [H, W, C]; any numeric dtype. The model's mean/std are applied (no channel swap,
        guide 10.3). Returns the outputs as a list of float32 arrays (the ONNX shapes)."""
        _refuse(data_type=(data_type, None, "inputs are taken as the arrays' own dtype"),
                inputs_pass_through=(inputs_pass_through, None, "inputs are always normalized and quantized "
                                     "by the runtime"),
                get_frame_id=(get_frame_id, False, "frames have no id on the emulator"))
        return self._need_session("inference").run(inputs, data_format)

    @_api(failure=None)
    def eval_perf(self, is_print: bool = True, fix_freq: bool = True) -> str | None:
        """Guide 3.2.3: the per-layer performance table of the last inference (zero inputs if
        none ran) from npuemu's timing model at the platform's NPU clock, in the vendor's
        layout; with ``init_runtime(perf_debug=False)`` only the totals, as the vendor. Returns
        the text (printed when ``is_print``)."""
        _refuse(fix_freq=(fix_freq, True, "the emulated NPU always runs at the platform's fixed clock"))
        session = self._need_session("eval_perf")
        report = session.perf()
        platform = session.runtime.machine.platform if isinstance(session, NpuSession) else None
        mhz = platform.clock.npu_mhz if platform is not None else report.npu_mhz
        lines = [f"NPU Current Frequency List:\n- {int(mhz * 1e6)}  (emulated {session.chip}, no board)", ""]
        table = report.format_table()
        if not self._perf_debug:  # the vendor prints the per-layer table with perf_debug=True only
            table = "\n".join(line for line in table.splitlines()
                              if line.startswith(("Total Operator Elapsed", "Total Memory Read")))
        text = "\n".join(lines + [*(f"note: {note}" for note in report.notes), table]) + "\n"
        if is_print:
            print(text, end="")
        return text

    @_api(failure=None)
    def eval_memory(self, is_print: bool = True) -> str | None:
        """Guide 3.2.4: the model's memory (weights, internal tensors, other, total, file size),
        read from the model file; needs ``init_runtime(eval_mem=True)`` as the vendor's does.
        Returns the text (printed when ``is_print``)."""
        session = self._need_session("eval_memory")
        if not self._eval_mem:
            raise ConfigError("eval_memory needs init_runtime(..., eval_mem=True)")
        text = session.memory().format_text() + "\n"
        if is_print:
            print(text, end="")
        return text

    @_api()
    def accuracy_analysis(self, inputs: list[str], output_dir: str = "./snapshot", target: str | None = None,
                          device_id: str | None = None) -> int:
        """Guide 3.2.2: per-layer cosine and Euclidean distance of the quantized model against the
        float model on one sample (``inputs``: a .jpg/.png/.npy file per model input), written
        as the vendor's snapshot folder (tools/api/snapshot.py). The simulator columns are the
        compiler's fake-quant model; with ``target`` the runtime columns are the emulated NPU."""
        _refuse(device_id=(device_id, None, "no board is contacted; the emulated chip is `target`"))
        front = self._front
        if front is None:
            raise ConfigError("accuracy_analysis needs the original model: load_onnx + build (a model read by "
                              "load_rknn has lost it, as with the vendor's toolkit)")
        if target is not None:
            from npuemu.platforms import resolve_name
            if resolve_name(target) != front.platform.name:
                raise ConfigError(f"target {target!r}: the model was built for {front.platform.name}")
        files = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
        sample = _load_sample(front, files)
        report, dumps = snapshot.analyse(front, sample, self._source.name if self._source else "model",
                                         run_emulator=target is not None)
        from npuemu.tools.accuracy import format_table
        table = format_table(report)
        snapshot.write(Path(output_dir), table, dumps)
        print(table, end="")
        logs.method_log("accuracy_analysis").info(f"the error analysis results save to: {Path(output_dir)}/"
                                                  "error_analysis.txt")
        return 0

    def _need_session(self, method: str) -> NpuSession | RknnSession:
        if self._session is None:
            raise ConfigError(f"{method} needs the runtime: call init_runtime() first")
        return self._session

    def release(self) -> None:
        """Guide 3.1.1: drop the model and runtime and close the verbose file."""
        logs.close(self._file_log)
        self._file_log = None
        self._source = self._front = self._model = self._session = None


def _batch(rknn_batch_size: int | None) -> int:
    if rknn_batch_size is None:
        return 1
    if isinstance(rknn_batch_size, bool) or not isinstance(rknn_batch_size, int) or rknn_batch_size < 1:
        raise ConfigError(f"rknn_batch_size={rknn_batch_size!r}: expected a positive integer")
    return rknn_batch_size


def _load_sample(front: Any, files: list) -> dict:
    from .inputs import load_sample_files

    shapes = {name: front.graph.tensors[name].shape for name in front.graph.inputs}
    if not files:
        raise InputError("accuracy_analysis needs inputs=[one .jpg/.png/.npy file per model input]")
    return load_sample_files(files, shapes, dict(front.preprocess))  # mean/std (and RGB2BGR) of the build
