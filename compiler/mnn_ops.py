"""MNN op -> ONNX nodes, one function per MNN op type (used by ``mnn_import``).

Each function reads the op's parameter table (field ids in ``mnn_schema``) and appends the
equivalent ONNX nodes through the converter ``net`` (``node``, ``const``, ``temp``). Semantics
follow MNN's schema comments and what its ONNX converter writes for each ONNX op [V] (checked
by tests/compiler/test_mnn_import.py: the same model through the MNN file and the ONNX file
gives the same outputs). Anything outside what is mapped is refused by ``op.refuse``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from npuemu.compiler import mnn_schema as S

_INT64_MAX = np.iinfo(np.int64).max


# ---- inputs and constants --------------------------------------------------------------------

def _input(net, op) -> None:
    param = op.param("Input")
    dims = [int(d) for d in param.array(S.INPUT["dims"], "i4")] if param else []
    dtype = param.scalar(S.INPUT["dtype"], "i", S.DT_FLOAT) if param else S.DT_FLOAT
    if dtype not in S.FLOAT_TYPES:
        raise op.refuse(f"input data type {dtype}: only float inputs are supported")
    name = op.outputs[0]
    shape = [d if d > 0 else f"{name}_dim{i}" for i, d in enumerate(dims)]  # -1/0: fixed by --input-shape
    net.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))


def _blob_value(op, blob) -> np.ndarray:
    if blob is None:
        raise op.refuse("constant without data")
    if len(blob.array(S.BLOB["external"], "i8")):
        raise op.refuse("constant stored in an external weight file")
    dims = [int(d) for d in blob.array(S.BLOB["dims"], "i4")]
    dtype = blob.scalar(S.BLOB["dataType"], "i", S.DT_FLOAT)
    if dtype in S.FLOAT_TYPES:
        data = blob.array(S.BLOB["float32s"], "f4").astype(np.float32)
    elif dtype in S.INT_TYPES:  # integer tensors are shape arithmetic: int64, as ONNX's shape ops use
        arrays = [blob.array(S.BLOB[k], t) for k, t in
                  (("int32s", "i4"), ("int64s", "i8"), ("uint8s", "u1"), ("int8s", "i1"))]
        data = next((a for a in arrays if len(a)), arrays[0]).astype(np.int64)
    else:
        raise op.refuse(f"constant of data type {dtype}: only float and integer constants are supported")
    if any(d < 0 for d in dims) or int(np.prod(dims)) != data.size:
        raise op.refuse(f"constant of dims {dims} holds {data.size} values")
    if blob.scalar(S.BLOB["dataFormat"], "b", S.NCHW) == S.NHWC and len(dims) == 4:
        raise op.refuse("4-D constant stored NHWC (only NCHW models, as MNN converts from ONNX, are read)")
    return data.reshape(dims)


def _const(net, op) -> None:
    value = _blob_value(op, op.param("Blob"))
    name = op.outputs[0]
    net.initializers.append(_tensor(value, name))
    net.constants[name] = value


def _tensor(value: np.ndarray, name: str):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.array(value, order="C"), name)


# ---- convolution, pooling, fully connected ------------------------------------------------------

def _pads(op, table, ids, explicit_pads: np.ndarray) -> dict:
    """ONNX pads / auto_pad of an MNN conv or pool: ``pads`` holds [top, left, bottom, right]
    as ONNX's begin/end order when given, else padY/padX apply to both sides."""
    mode = table.scalar(ids["padMode" if "padMode" in ids else "padType"], "b", S.PAD_CAFFE)
    if mode == S.PAD_SAME:
        return {"auto_pad": "SAME_UPPER"}
    if mode == S.PAD_VALID:
        return {"pads": [0, 0, 0, 0]}
    if len(explicit_pads) == 4:
        return {"pads": [int(p) for p in explicit_pads]}
    if len(explicit_pads):
        raise op.refuse(f"{len(explicit_pads)} pad values (2-D ops take 4)")
    pad_y, pad_x = table.scalar(ids["padY"]), table.scalar(ids["padX"])
    return {"pads": [pad_y, pad_x, pad_y, pad_x]}


def _conv(net, op) -> None:
    param = op.param("Convolution2D")
    common = param.table(S.CONV2D["common"]) if param else None
    if common is None:
        raise op.refuse("convolution without parameters")
    if param.table(S.CONV2D["quanParameter"]) or param.table(S.CONV2D["symmetricQuan"]):
        raise op.refuse("quantized (int8 / weight-compressed) MNN weights are not supported; convert in float")
    c = S.CONV2D_COMMON
    kx, ky = common.scalar(c["kernelX"], "i", 1), common.scalar(c["kernelY"], "i", 1)
    out_count, group = common.scalar(c["outputCount"]), common.scalar(c["group"], "i", 1)
    attrs = _conv_attrs(op, common, ky, kx, group)
    if len(op.inputs) > 1:  # weights (and bias) given as tensors
        inputs = list(op.inputs)
    else:
        weight, bias = param.array(S.CONV2D["weight"], "f4"), param.array(S.CONV2D["bias"], "f4")
        per_group = weight.size // max(out_count * kx * ky, 1)
        if out_count <= 0 or weight.size == 0 or per_group * out_count * kx * ky != weight.size:
            raise op.refuse(f"{weight.size} weights do not fit {out_count} outputs of {ky}x{kx}")
        if bias.size not in (0, out_count):
            raise op.refuse(f"{bias.size} biases for {out_count} outputs")
        inputs = _weights_and_bias(net, op, weight.reshape(out_count, per_group, ky, kx), bias)
    _node_with_relu(net, op, common, "Conv", inputs, attrs)


def _deconv(net, op) -> None:
    """Deconvolution as ONNX ConvTranspose; [V] MNN keeps ONNX's weight layout
    [inputCount, outputCount / group, kY, kX] (test_mnn_import.py checks the outputs)."""
    param = op.param("Convolution2D")
    common = param.table(S.CONV2D["common"]) if param else None
    c = S.CONV2D_COMMON
    if common is None or param.table(S.CONV2D["quanParameter"]) or len(op.inputs) != 1:
        raise op.refuse("only float Deconvolution with stored weights is mapped")
    if common.scalar(c["hasOutputShape"], "b", 0) or common.scalar(c["padMode"], "b", 0) != S.PAD_CAFFE:
        raise op.refuse("Deconvolution with an output shape or SAME/VALID padding is not mapped")
    kx, ky = common.scalar(c["kernelX"], "i", 1), common.scalar(c["kernelY"], "i", 1)
    out_count, group = common.scalar(c["outputCount"]), common.scalar(c["group"], "i", 1)
    weight, bias = param.array(S.CONV2D["weight"], "f4"), param.array(S.CONV2D["bias"], "f4")
    per_group = out_count // max(group, 1)
    in_count = weight.size // max(per_group * kx * ky, 1)
    if out_count <= 0 or group <= 0 or weight.size == 0 or in_count * per_group * kx * ky != weight.size \
            or bias.size not in (0, out_count):
        raise op.refuse(f"{weight.size} weights, {bias.size} biases do not fit {out_count} outputs of {ky}x{kx}")
    out_pads = [int(p) for p in common.array(c["outPads"], "i4")]
    attrs = _conv_attrs(op, common, ky, kx, group)
    if out_pads:
        attrs["output_padding"] = out_pads
    inputs = _weights_and_bias(net, op, weight.reshape(in_count, per_group, ky, kx), bias)
    _node_with_relu(net, op, common, "ConvTranspose", inputs, attrs)


def _conv_attrs(op, common, ky: int, kx: int, group: int) -> dict:
    """ONNX Conv/ConvTranspose attributes of a Convolution2DCommon table."""
    c = S.CONV2D_COMMON
    return dict(kernel_shape=[ky, kx], strides=[common.scalar(c["strideY"], "i", 1), common.scalar(c["strideX"], "i", 1)],
                dilations=[common.scalar(c["dilateY"], "i", 1), common.scalar(c["dilateX"], "i", 1)], group=group,
                **_pads(op, common, c, common.array(c["pads"], "i4")))


def _weights_and_bias(net, op, weight: np.ndarray, bias: np.ndarray) -> list[str]:
    """[input, weight constant, bias constant if stored] of a (de)convolution."""
    inputs = [op.inputs[0], net.const(weight.astype(np.float32), op.name + "_w")]
    if bias.size:
        inputs.append(net.const(bias.astype(np.float32), op.name + "_b"))
    return inputs


def _node_with_relu(net, op, common, op_type: str, inputs: list[str], attrs: dict) -> None:
    """The (de)convolution node, then the Relu or Relu6 (Clip) its common part asks for."""
    c = S.CONV2D_COMMON
    relu, relu6 = common.scalar(c["relu"], "b", 0), common.scalar(c["relu6"], "b", 0)
    out = net.temp(op.outputs[0]) if relu or relu6 else op.outputs[0]
    net.node(op_type, inputs, [out], op.name, **attrs)
    if relu6:
        _clip(net, out, op.outputs[0], 0.0, 6.0)
    elif relu:
        net.node("Relu", [out], [op.outputs[0]])


def _clip(net, source: str, target: str, low: float, high: float) -> None:
    net.node("Clip", [source, net.const(np.array(low, np.float32), target + "_min"),
                      net.const(np.array(high, np.float32), target + "_max")], [target])


def _pool(net, op) -> None:
    param, p = op.param("Pool"), S.POOL
    if param is None:
        raise op.refuse("pooling without parameters")
    kind = param.scalar(p["type"], "b", S.MAXPOOL)
    if kind not in (S.MAXPOOL, S.AVEPOOL):
        raise op.refuse(f"pool type {kind}")
    if param.scalar(p["isGlobal"], "b", 0):
        net.node("GlobalMaxPool" if kind == S.MAXPOOL else "GlobalAveragePool", op.inputs[:1], op.outputs[:1], op.name)
        return
    attrs = dict(kernel_shape=[param.scalar(p["kernelY"]), param.scalar(p["kernelX"])],
                 strides=[param.scalar(p["strideY"], "i", 1) or 1, param.scalar(p["strideX"], "i", 1) or 1],
                 ceil_mode=int(bool(param.scalar(p["ceilModel"], "b", 1))),
                 **_pads(op, param, p, param.array(p["pads"], "i4")))
    if kind == S.AVEPOOL:
        # [V] MNN's ONNX converter writes DEFAULT for count_include_pad=0, INCLUDE_PADDING for 1
        attrs["count_include_pad"] = int(param.scalar(p["countType"], "b", 0) == S.COUNT_INCLUDE_PADDING)
    net.node("MaxPool" if kind == S.MAXPOOL else "AveragePool", op.inputs[:1], op.outputs[:1], op.name, **attrs)


def _pool3d(net, op) -> None:
    param = op.param("Pool3D")
    if param is None or not param.scalar(S.POOL3D["isGlobal"], "b", 0):
        raise op.refuse("only global Pooling3D (GlobalAveragePool / GlobalMaxPool) is mapped")
    kind = param.scalar(S.POOL3D["type"], "b", S.MAXPOOL)
    net.node("GlobalMaxPool" if kind == S.MAXPOOL else "GlobalAveragePool", op.inputs[:1], op.outputs[:1], op.name)


def _inner_product(net, op) -> None:
    param, f = op.param("InnerProduct"), S.INNER_PRODUCT
    if param is None or param.table(f["quanParameter"]):
        raise op.refuse("InnerProduct without float weights")
    count, axis = param.scalar(f["outputCount"]), param.scalar(f["axis"], "i", 1)
    weight, bias = param.array(f["weight"], "f4"), param.array(f["bias"], "f4")
    if axis != 1 or count <= 0 or weight.size % count or bias.size not in (0, count):
        raise op.refuse(f"InnerProduct of axis {axis}, {count} outputs, {weight.size} weights, {bias.size} biases")
    transposed = bool(param.scalar(f["transpose"], "b", 0))
    shape = (weight.size // count, count) if transposed else (count, weight.size // count)
    flat = net.temp(op.outputs[0])
    net.node("Flatten", op.inputs[:1], [flat], axis=1)
    inputs = [flat, net.const(weight.reshape(shape).astype(np.float32), op.name + "_w")]
    if bias.size:
        inputs.append(net.const(bias.astype(np.float32), op.name + "_b"))
    net.node("Gemm", inputs, op.outputs[:1], op.name, transB=int(not transposed))


def _matmul(net, op) -> None:
    param = op.param("MatMul")
    if param is not None:
        f = S.MATMUL
        if param.array(f["weight"], "f4").size or param.scalar(f["transposeA"], "b", 0) or \
                param.scalar(f["transposeB"], "b", 0):
            raise op.refuse("MatMul with stored weights or transposed operands is not mapped")
    if len(op.inputs) != 2:
        raise op.refuse(f"MatMul with {len(op.inputs)} inputs")
    net.node("MatMul", op.inputs, op.outputs[:1], op.name)


def _batch_matmul(net, op) -> None:
    param = op.param("BatchMatMulParam")
    if param is not None and (param.scalar(0, "b", 0) or param.scalar(1, "b", 0)):
        raise op.refuse("BatchMatMul with adjX/adjY is not mapped")
    net.node("MatMul", op.inputs[:2], op.outputs[:1], op.name)


# ---- element-wise and activations ---------------------------------------------------------

def _binary(net, op) -> None:
    param = op.param("BinaryOp")
    kind = param.scalar(S.BINARY["opType"]) if param else 0
    onnx_op = S.BINARY_OPS.get(kind)
    if onnx_op is None:
        raise op.refuse(f"binary operation {kind} is not mapped")
    activation = param.scalar(S.BINARY["activationType"]) if param else 0
    if activation not in (0, 1):
        raise op.refuse(f"fused activation {activation}")
    out = net.temp(op.outputs[0]) if activation else op.outputs[0]
    net.node(onnx_op, op.inputs[:2], [out], op.name)
    if activation:  # [I] activationType 1 is MNN's fused ReLU (the only value its optimizer sets)
        net.node("Relu", [out], op.outputs[:1])


def _eltwise(net, op) -> None:
    param = op.param("Eltwise")
    kind = param.scalar(S.ELTWISE["type"], "b", 1) if param else 1
    coeff = param.array(S.ELTWISE["coeff"], "f4") if param else np.zeros(0)
    if kind not in S.ELTWISE_OPS or (coeff.size and not np.all(coeff == 1)):
        raise op.refuse(f"Eltwise type {kind} with coefficients {coeff.tolist()}")
    if len(op.inputs) < 2:
        raise op.refuse("Eltwise of fewer than two inputs")
    total = op.inputs[0]
    for i, other in enumerate(op.inputs[1:]):
        out = op.outputs[0] if i == len(op.inputs) - 2 else net.temp(op.outputs[0])
        net.node(S.ELTWISE_OPS[kind], [total, other], [out], op.name if out == op.outputs[0] else "")
        total = out


def _unary(net, op) -> None:
    param = op.param("UnaryOp")
    kind = param.scalar(S.UNARY["opType"]) if param else 0
    x, y = op.inputs[0], op.outputs[0]
    if kind == S.UNARY_SQUARE:
        net.node("Mul", [x, x], [y], op.name)
    elif kind == S.UNARY_SILU:
        gate = net.temp(y)
        net.node("Sigmoid", [x], [gate])
        net.node("Mul", [x, gate], [y], op.name)
    elif kind in S.UNARY_OPS:
        chain = S.UNARY_OPS[kind]
        for i, onnx_op in enumerate(chain):
            out = y if i == len(chain) - 1 else net.temp(y)
            net.node(onnx_op, [x], [out], op.name if out == y else "")
            x = out
    else:
        raise op.refuse(f"unary operation {kind} is not mapped")


def _relu(net, op) -> None:
    param = op.param("Relu")
    slope = param.scalar(S.RELU["slope"], "f", 0.0) if param else 0.0
    if slope:
        net.node("LeakyRelu", op.inputs[:1], op.outputs[:1], op.name, alpha=slope)
    else:
        net.node("Relu", op.inputs[:1], op.outputs[:1], op.name)


def _relu6(net, op) -> None:
    param = op.param("Relu6")
    low = param.scalar(S.RELU6["minValue"], "f", 0.0) if param else 0.0
    high = param.scalar(S.RELU6["maxValue"], "f", 6.0) if param else 6.0
    _clip(net, op.inputs[0], op.outputs[0], low, high)


def _prelu(net, op) -> None:
    param = op.param("PRelu")
    slope = param.array(S.PRELU["slope"], "f4").astype(np.float32) if param else np.zeros(0, np.float32)
    if slope.size == 0:
        raise op.refuse("PReLU without slopes")
    shape = (1,) if slope.size == 1 else (slope.size, 1, 1)
    net.node("PRelu", [op.inputs[0], net.const(slope.reshape(shape), op.name + "_slope")], op.outputs[:1], op.name)


def _elu(net, op) -> None:
    param = op.param("ELU")
    net.node("Elu", op.inputs[:1], op.outputs[:1], op.name, alpha=param.scalar(0, "f", 1.0) if param else 1.0)


def _scale(net, op) -> None:
    param = op.param("Scale")
    scale = param.array(S.SCALE["scaleData"], "f4").astype(np.float32) if param else np.zeros(0, np.float32)
    bias = param.array(S.SCALE["biasData"], "f4").astype(np.float32) if param else np.zeros(0, np.float32)
    if scale.size == 0 or bias.size not in (0, scale.size):
        raise op.refuse(f"Scale of {scale.size} scales and {bias.size} biases")
    scaled = net.temp(op.outputs[0]) if bias.size else op.outputs[0]
    net.node("Mul", [op.inputs[0], net.const(scale.reshape(-1, 1, 1), op.name + "_scale")], [scaled], op.name)
    if bias.size:
        net.node("Add", [scaled, net.const(bias.reshape(-1, 1, 1), op.name + "_bias")], op.outputs[:1])


def _plain(onnx_op: str):
    def mapping(net, op) -> None:
        net.node(onnx_op, op.inputs[:1], op.outputs[:1], op.name)
    return mapping


def _axis_op(onnx_op: str):
    def mapping(net, op) -> None:
        param = op.param("Axis")
        net.node(onnx_op, op.inputs, op.outputs[:1], op.name, axis=param.scalar(S.AXIS["axis"]) if param else 0)
    return mapping


# ---- layout, shape arithmetic ----------------------------------------------------------------

#: ConvertTensor between MNN layouts: NCHW and NC4HW4 hold the same logical NCHW tensor, NHWC
#: (and NHWC4) tensors keep their dims in NHWC order, so converting to or from them transposes
_NCHW_LIKE = {S.NCHW, S.NC4HW4}
_NHWC_LIKE = {S.NHWC, S.NHWC4}


def _convert_tensor(net, op) -> None:
    param = op.param("TensorConvertInfo")
    source = param.scalar(S.CONVERT["source"], "b", S.NCHW) if param else S.NCHW
    dest = param.scalar(S.CONVERT["dest"], "b", S.NCHW) if param else S.NCHW
    if (source in _NCHW_LIKE and dest in _NCHW_LIKE) or (source in _NHWC_LIKE and dest in _NHWC_LIKE):
        net.node("Identity", op.inputs[:1], op.outputs[:1], op.name)
    elif source in _NCHW_LIKE and dest in _NHWC_LIKE:
        net.node("Transpose", op.inputs[:1], op.outputs[:1], op.name, perm=[0, 2, 3, 1])
    elif source in _NHWC_LIKE and dest in _NCHW_LIKE:
        net.node("Transpose", op.inputs[:1], op.outputs[:1], op.name, perm=[0, 3, 1, 2])
    else:
        raise op.refuse(f"layout conversion {S.FORMAT_NAMES.get(source, source)} -> "
                        f"{S.FORMAT_NAMES.get(dest, dest)}")


def _reshape(net, op) -> None:
    param = op.param("Reshape")
    dims = param.array(S.RESHAPE["dims"], "i4") if param else np.zeros(0)
    if param is not None and param.scalar(S.RESHAPE["dimType"], "b", S.NCHW) == S.NHWC:
        raise op.refuse("Reshape in NHWC order (only NCHW models, as MNN converts from ONNX, are read)")
    if dims.size:
        shape = net.const(dims.astype(np.int64), op.name + "_shape")
    elif len(op.inputs) > 1:
        shape = op.inputs[1]
    else:
        raise op.refuse("Reshape without a target shape")
    net.node("Reshape", [op.inputs[0], shape], op.outputs[:1], op.name)


def _flatten(net, op) -> None:
    param = op.param("Flatten")
    axis = param.scalar(S.FLATTEN["axis"], "i", 1) if param else 1
    end = param.scalar(S.FLATTEN["endAxis"], "i", 0) if param else 0
    if axis != 1 or end not in (0, -1):  # [I] MNN keeps dims after endAxis; axis 1 to the end is ONNX's
        raise op.refuse(f"Flatten from axis {axis} to {end} (only axis 1 to the end is mapped)")
    net.node("Flatten", op.inputs[:1], op.outputs[:1], op.name, axis=1)


def _permute(net, op) -> None:
    param = op.param("Permute")
    dims = [int(d) for d in param.array(S.PERMUTE["dims"], "i4")] if param else []
    if sorted(dims) != list(range(len(dims))) or not dims:
        raise op.refuse(f"permutation {dims}")
    net.node("Transpose", op.inputs[:1], op.outputs[:1], op.name, perm=dims)


def _transpose(net, op) -> None:
    perm = [int(d) for d in net.const_value(op, 1).reshape(-1)]
    if sorted(perm) != list(range(len(perm))):
        raise op.refuse(f"permutation {perm}")
    net.node("Transpose", op.inputs[:1], op.outputs[:1], op.name, perm=perm)


def _axes_input(net, op, param, field: int, name: str) -> str:
    axes = param.array(field, "i4") if param else np.zeros(0)
    if axes.size:
        return net.const(axes.astype(np.int64), op.name + name)
    if len(op.inputs) > 1:
        return op.inputs[1]
    raise op.refuse("no axes given")


def _squeeze_op(onnx_op: str):
    def mapping(net, op) -> None:
        axes = _axes_input(net, op, op.param("SqueezeParam"), S.SQUEEZE["squeezeDims"], "_axes")
        net.node(onnx_op, [op.inputs[0], axes], op.outputs[:1], op.name)
    return mapping


def _expand_dims(net, op) -> None:
    param = op.param("ExpandDims")
    if len(op.inputs) > 1:
        axes = op.inputs[1]
    else:
        axes = net.const(np.array([param.scalar(S.EXPAND_DIMS["axis"]) if param else 0], np.int64), op.name + "_axes")
    net.node("Unsqueeze", [op.inputs[0], axes], op.outputs[:1], op.name)


def _rank(net, op) -> None:
    shape = net.temp(op.outputs[0])
    net.node("Shape", op.inputs[:1], [shape])
    net.node("Size", [shape], op.outputs[:1], op.name)


def _cast(net, op) -> None:
    param = op.param("CastParam")
    dest = param.scalar(S.CAST["dstT"], "i", S.DT_FLOAT) if param else S.DT_FLOAT
    if dest in S.FLOAT_TYPES:
        net.node("Cast", op.inputs[:1], op.outputs[:1], op.name, to=TensorProto.FLOAT)
    elif dest in S.INT_TYPES:
        net.node("Cast", op.inputs[:1], op.outputs[:1], op.name, to=TensorProto.INT64)
    else:
        raise op.refuse(f"cast to data type {dest}")


def _slice_tf(net, op) -> None:
    """TensorFlow-style slice (input, begin, size; size -1 = to the end) as ONNX Slice."""
    if len(op.inputs) != 3:
        raise op.refuse(f"SliceTf with {len(op.inputs)} inputs")
    x, begin, size = op.inputs
    y = op.outputs[0]
    summed, negative, ends = (net.temp(y) for _ in range(3))
    net.node("Add", [begin, size], [summed])
    net.node("Less", [size, net.const(np.array(0, np.int64), y + "_zero")], [negative])
    net.node("Where", [negative, net.const(np.array(_INT64_MAX, np.int64), y + "_max"), summed], [ends])
    net.node("Slice", [x, begin, ends], [y], op.name)


def _gather(net, op) -> None:
    if op.main_type == S.PARAMS["Gather"]:
        param = op.param("Gather")
        axis = param.scalar(S.GATHER["axis"]) if param else 0
    else:
        axis = int(net.const_value(op, 2).reshape(-1)[0]) if len(op.inputs) > 2 else 0
    net.node("Gather", op.inputs[:2], op.outputs[:1], op.name, axis=axis)


def _reduction(net, op) -> None:
    param = op.param("ReductionParam")
    kind = param.scalar(S.REDUCTION["operation"], "b", 0) if param else 0
    onnx_op = S.REDUCTIONS.get(kind)
    if onnx_op is None:
        raise op.refuse(f"reduction {kind} is not mapped")
    keep = int(bool(param.scalar(S.REDUCTION["keepDims"], "b", 0))) if param else 0
    axes_name = _axes_input(net, op, param, S.REDUCTION["dim"], "_axes")
    if onnx_op == "ReduceSum":  # opset 13: ReduceSum takes axes as an input, the others as an attribute
        net.node(onnx_op, [op.inputs[0], axes_name], op.outputs[:1], op.name, keepdims=keep)
        return
    if axes_name not in net.constants:
        raise op.refuse("reduction axes must be constant")
    axes = [int(a) for a in net.constants[axes_name].reshape(-1)]
    net.node(onnx_op, op.inputs[:1], op.outputs[:1], op.name, axes=axes, keepdims=keep)


def _select(net, op) -> None:
    if len(op.inputs) != 3:
        raise op.refuse(f"Select with {len(op.inputs)} inputs")
    net.node("Where", op.inputs, op.outputs[:1], op.name)


def _strided_slice(net, op) -> None:
    """fromType 1 is an ONNX Slice (data, starts, ends[, axes[, steps]]) kept as it was; fromType 0
    is TensorFlow's (data, begin, end, strides), mapped when no mask is set."""
    param = op.param("StridedSliceParam")
    f = S.STRIDED_SLICE
    masks = [param.scalar(f[k]) for k in ("beginMask", "endMask", "ellipsisMask", "newAxisMask", "shrinkAxisMask")] \
        if param else [0] * 5
    from_onnx = bool(param.scalar(f["fromType"])) if param else False
    if any(masks):
        raise op.refuse(f"StridedSlice with masks {masks} is not mapped")
    if from_onnx and 3 <= len(op.inputs) <= 5:
        net.node("Slice", op.inputs, op.outputs[:1], op.name)
    elif not from_onnx and len(op.inputs) == 4:
        net.node("Slice", [*op.inputs[:3], "", op.inputs[3]], op.outputs[:1], op.name)
    else:
        raise op.refuse(f"StridedSlice with {len(op.inputs)} inputs")


def _interp(net, op) -> None:
    """Interp as ONNX Resize: the second input holds scales (float) or sizes (integer)."""
    param, f = op.param("Interp"), S.INTERP
    if param is None:
        raise op.refuse("Interp without parameters")
    mode = S.RESIZE_MODES.get(param.scalar(f["resizeType"]))
    ctm = param.scalar(f["ctm"], "b", 0)
    if ctm == 0:  # NotSet: the older flags say it
        ctm = 1 if param.scalar(f["alignCorners"], "b", 0) else 2 if param.scalar(f["halfPixelCenters"], "b", 0) else 4
    if mode is None or ctm not in S.CTM_NAMES:
        raise op.refuse(f"Interp of resizeType {param.scalar(f['resizeType'])} and coordinate mode {ctm}")
    if param.scalar(f["widthOffset"], "f", 0.0) or param.scalar(f["heightOffset"], "f", 0.0):
        raise op.refuse("Interp with offsets is not mapped")
    attrs = dict(mode=mode, coordinate_transformation_mode=S.CTM_NAMES[ctm])
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"  # [I] MNN's nearest Interp takes floor(source coordinate)
    if mode == "cubic":
        attrs["cubic_coeff_a"] = param.scalar(f["cubicCoeffA"], "f", -0.75)
    if len(op.inputs) == 2:
        given = net.const_value(op, 1)
        size_or_scale = ["", op.inputs[1]] if given.dtype.kind == "f" else ["", "", op.inputs[1]]
    else:
        scales = [1.0, 1.0, param.scalar(f["heightScale"], "f", 0.0), param.scalar(f["widthScale"], "f", 0.0)]
        if not all(scale > 0 for scale in scales):
            raise op.refuse("Interp without a scale or size input")
        size_or_scale = ["", net.const(np.array(scales, np.float32), op.name + "_scales")]
    net.node("Resize", [op.inputs[0], *size_or_scale], op.outputs[:1], op.name, **attrs)


def _slice(net, op) -> None:
    """Caffe's Slice (what MNN's converter writes for a grouped deconvolution): cut positions
    along an axis, one ONNX Slice per piece; no positions = equal pieces (ONNX Split)."""
    param = op.param("Slice")
    axis = param.scalar(S.SLICE["axis"]) if param else 1
    points = [int(p) for p in param.array(S.SLICE["slicePoints"], "i4")] if param else []
    if param is not None and param.scalar(S.SLICE["sourceType"], "b", 0) != 0:
        raise op.refuse("Slice of a TensorFlow/ONNX source (split sizes) is not mapped")
    if not points:
        net.node("Split", op.inputs[:1], op.outputs, op.name, axis=axis)
        return
    if len(points) != len(op.outputs) - 1 or points != sorted(points) or points[0] < 0:
        raise op.refuse(f"slice points {points} for {len(op.outputs)} outputs")
    bounds = [0, *points, _INT64_MAX]
    axes = net.const(np.array([axis], np.int64), op.name + "_axis")
    for i, out in enumerate(op.outputs):
        begin = net.const(np.array([bounds[i]], np.int64), out + "_begin")
        end = net.const(np.array([bounds[i + 1]], np.int64), out + "_end")
        net.node("Slice", [op.inputs[0], begin, end, axes], [out], op.name if i == 0 else "")


MAPPINGS = {
    "Input": _input, "Const": _const, "Convolution": _conv, "ConvolutionDepthwise": _conv,
    "Deconvolution": _deconv, "Pooling": _pool, "Pooling3D": _pool3d, "InnerProduct": _inner_product, "MatMul": _matmul,
    "BatchMatMul": _batch_matmul, "BinaryOp": _binary, "Eltwise": _eltwise, "UnaryOp": _unary,
    "ReLU": _relu, "ReLU6": _relu6, "PReLU": _prelu, "ELU": _elu, "Scale": _scale,
    "Sigmoid": _plain("Sigmoid"), "TanH": _plain("Tanh"), "Dropout": _plain("Identity"),
    "Softmax": _axis_op("Softmax"), "Concat": _axis_op("Concat"),
    "ConvertTensor": _convert_tensor, "Reshape": _reshape, "Flatten": _flatten, "Permute": _permute,
    "Transpose": _transpose, "Squeeze": _squeeze_op("Squeeze"), "Unsqueeze": _squeeze_op("Unsqueeze"),
    "ExpandDims": _expand_dims, "Shape": _plain("Shape"), "Size": _plain("Size"), "Rank": _rank,
    "Cast": _cast, "StridedSlice": _strided_slice, "Slice": _slice, "Interp": _interp, "Select": _select, "SliceTf": _slice_tf, "Gather": _gather, "GatherV2": _gather, "Reduction": _reduction,
}
